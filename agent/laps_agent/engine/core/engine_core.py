"""The engine's scheduling core: one engine's single-threaded state machine (admission, prefill
batches, decode steps, stop handling), torch-free. It owns its `PrefillScheduler`, its KV
allocator and a `PDHandoff` (pd_handoff.py: KV imports and exports, prefix warms) and drives a
runner (forward.py's `Runner`, the torch ModelRunner in practice) and a sampler it is given.
engine.py's `Engine` owns one of these and a runner and calls it from its own thread; everything
here runs on that thread only.

One iteration (`step`): admit decode requests whose KV arrived -> at most ONE prefill batch,
chosen by the scheduler (only while fewer than max_running requests decode) -> ONE decode step
for every running request; when none of that ran, one prefix-warm chunk."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from laps_agent.engine.core.config import EngineConfig, PrefillRecord, PrefillRequest, kv_reservation
from laps_agent.engine.core.forward import ForwardItem, Runner, Sampler
from laps_agent.engine.core.kv_cache import KVCacheFull, PagedKVAllocator
from laps_agent.engine.core.pd_handoff import PDHandoff
from laps_agent.engine.core.requests import EngineOutput, GenerateWork, OutputSink
from laps_agent.engine.core.sampling_params import StopState
from laps_agent.engine.core.warm_queue import WarmQueue
from laps_agent.policy.classes import length_class
from laps_agent.policy.scheduling.buckets import bucket_for_batch
from laps_agent.policy.scheduling.queues import PrefillItem, PrefillScheduler
from laps_agent.policy.scheduling.window import PrefillCostModel

log = logging.getLogger("laps_agent.engine.engine")


@dataclass
class _Live:
    work: GenerateWork
    sink: OutputSink
    stop: StopState
    cls: str
    cached: int = 0   # prompt tokens whose KV came from the prefix cache (known after allocation)


class EngineCore:
    """One engine's loop state. `sample(logits, params, steps)`: a token per row, or the row's
    exception (model/sampling.sample_each). `on_prefill_start(requests, uncached tokens)`: a
    prefill batch has left the queues and its forward pass starts."""

    def __init__(self, runner: Runner, tokenizer: Any, config: EngineConfig, *, sample: Sampler,
                 grid: Any = None,
                 on_prefill: Callable[[PrefillRecord], None] | None = None,
                 on_first_token: Callable[[str, float], None] | None = None,
                 on_warm: Callable[[str, int], None] | None = None,
                 on_prefill_start: Callable[[int, int], None] | None = None) -> None:
        self.runner, self.tokenizer, self.config, self.sample = runner, tokenizer, config, sample
        self.grid = grid if config.batch_prefill_graphs else None
        self.scheduler = PrefillScheduler(config.scheduler, self.grid)
        # A decode engine keeps no prefix cache: it computes no prompt (its KV arrives whole from
        # the prefill engine, which sends all of it: the PD protocol has no way to send only what
        # is missing), so cached pages there could only take room from running requests.
        self.kv = PagedKVAllocator(runner.num_pages, runner.page_size,
                                   prefix_cache=config.prefix_cache and config.role != "decode")
        self._evicted_seen = 0  # kv.evicted_pages already reported in a PrefillRecord
        self.eos_ids = frozenset(getattr(tokenizer, "eos_token_ids", ()) or ())
        self.on_prefill, self.on_first_token = on_prefill, on_first_token
        self.on_prefill_start = on_prefill_start
        # Prefill role: warms, at the lowest priority (pd/prefix_warm.py).
        self.warms = WarmQueue(runner.page_size, config.scheduler.length_threshold, on_warm)
        self.pd = PDHandoff(runner, self.kv, self.warms)
        self._live: dict[str, _Live] = {}
        self._running: list[str] = []          # decoding, in admission order
        self.steps = 0
        # seconds of a decode step ~= overhead + per request x requests in it (the planner's
        # decode cost): the prefill cost's fit, over the step's requests instead of tokens.
        self.decode_cost = PrefillCostModel()

    def max_prompt_tokens(self) -> int:
        """Longest prompt this engine can take: prompt + completion must fit the context and the
        KV pool, and a request always gets at least one new token."""
        return min(self.config.context_len, self.kv.capacity_tokens) - 1

    # ---- what the engine's thread calls ------------------------------------------------------
    def step(self) -> tuple[bool, float | None]:
        """One iteration (module docstring). Returns (whether anything ran, when the scheduler's
        waiting window wants the next iteration at the latest: None for no such time)."""
        worked = self._admit_imports()
        wake_at = None
        if len(self._running) < self.config.max_running_requests:
            ran, wake_at = self._prefill_once()
            worked |= ran
        if self._running:
            self._decode_once()
            worked = True
        if not worked:
            worked = self.pd.warm_idle(busy=bool(len(self.scheduler) or self._running))
        return worked, wake_at

    def snapshot(self, prefilling: tuple[int, int] = (0, 0)) -> dict[str, Any]:
        """What this engine holds now (metrics, /get_load, /get_server_info); `prefilling`:
        (requests, uncached tokens) of the prefill batch whose forward pass runs."""
        return {"running": len(self._running), "queues": self.scheduler.pending(),
                "prefilling": prefilling, "kv_usage": self.kv.usage_ratio(),
                "waiting_kv": len(self.pd.imports), "live": len(self._live),
                "prefix_cache_pages": self.kv.cached_pages, "warms": len(self.warms),
                "prefill_cost": self.scheduler.prefill_cost(), "decode_cost": self.decode_cost.linear(),
                "max_prefill_tokens": self.scheduler.config.max_prefill_tokens,
                "max_long_batch_tokens": self.scheduler.config.max_long_batch_tokens}

    def accept(self, work: GenerateWork, sink: OutputSink) -> None:
        if work.kind == "warm":
            self.pd.add_warm(work)
            return
        if work.rid in self._live:
            sink(EngineOutput(work.rid, finished=True, finish_reason="error", error_status=400,
                              error=f"request id {work.rid!r} is already in use"))
            return
        stop = StopState(work.params, self.eos_ids, self._decode_text, context=work.input_ids)
        live = _Live(work, sink, stop, cls=self._classify(len(work.input_ids)), cached=work.cached_tokens)
        self._live[work.rid] = live
        if work.kind == "decode":
            order = self.config.decode_order
            self.pd.queue_import(work.rid, 0.0 if order is None else order.deadline(
                work.received_at, len(work.input_ids)))
        else:
            # Matched at admission, so the request is classified (and counted in the queues) by
            # what prefill will really compute here. Nothing is held until the batch starts:
            # pinning cached pages for queued requests could fill the pool with prefixes of
            # requests that cannot start. If some of it is evicted meanwhile, the prefill just
            # computes more (_prefill_once re-matches); the class stays.
            item = PrefillItem(rid=work.rid, prompt_tokens=len(work.input_ids),
                               cached_tokens=self.kv.match(work.input_ids), arrival=work.arrival)
            try:
                live.cls = self.scheduler.add(item, time.monotonic())
            except ValueError as exc:  # refused by the scheduler: fail this request only
                self._fail(work.rid, str(exc))

    def _classify(self, tokens: int) -> str:
        return length_class(tokens, self.config.scheduler.length_threshold)

    def abort(self, rid: str) -> None:
        live = self._live.pop(rid, None)
        if live is None:
            return
        self.scheduler.abort(rid)
        if rid in self._running:
            self._running.remove(rid)
        self.pd.forget(rid)
        self.kv.free(rid)
        self._emit(live, EngineOutput(rid, finished=True, finish_reason="abort"))

    def fail_all(self, message: str) -> None:
        for rid in list(self._live):
            self._fail(rid, message)

    # ---- the steps of an iteration -----------------------------------------------------------
    def _reserve_tokens(self, work: GenerateWork) -> int:
        return kv_reservation(work.kind, len(work.input_ids), work.params.max_new_tokens,
                              self.config.context_len, self.kv.capacity_tokens)

    def _admit_imports(self) -> bool:
        """Decode role: requests whose KV arrived take their pages while decode slots are free,
        by deadline (config.decode_order) or in arrival order; each then sends its first token
        (the prefill engine's)."""
        worked, by_deadline = False, self.config.decode_order is not None
        while len(self._running) < self.config.max_running_requests and \
                (rid := self.pd.next_import(by_deadline, time.monotonic())) is not None:
            live = self._live[rid]
            try:
                pages = self.pd.admit_import(rid, self._reserve_tokens(live.work))
            except KVCacheFull:
                return worked
            worked = True
            try:
                self.pd.import_kv(pages, live.work)
            except Exception as exc:  # noqa: BLE001 - a bad transfer must not kill the loop
                log.exception("KV import failed for %s", rid)
                self._fail(rid, f"KV import failed: {exc}")
                continue
            self._take_token(live, live.work.first_token, first=True)
        return worked

    def _prefill_once(self) -> tuple[bool, float | None]:
        now = time.monotonic()
        decision = self.scheduler.next_batch(now)
        if not decision.batch:
            return False, decision.wake_at
        admitted = []
        for i, item in enumerate(decision.batch):
            live = self._live.get(item.rid)
            if live is None:
                continue  # aborted between scheduling and now
            try:
                self.kv.allocate(item.rid, self._reserve_tokens(live.work), live.work.input_ids)
            except KVCacheFull:
                # Out of pages: the rest go back to the head of their queue (keeping their
                # waiting time) while decode finishes requests and frees pages.
                self.scheduler.requeue([r for r in decision.batch[i:] if r.rid in self._live], now)
                break
            live.cached = self.kv.cached_tokens(item.rid)
            admitted.append(item)
        if not admitted:
            return False, None
        self._run_prefill(admitted, decision.queue)
        return True, None

    def _run_prefill(self, batch: list, queue: str | None) -> None:
        lives = [self._live[item.rid] for item in batch]
        # Only the uncached suffix is computed; it attends to the cached prefix's pages.
        items = [ForwardItem(token_ids=list(l.work.input_ids[l.cached:]), start_pos=l.cached,
                             pages=self.kv.pages_covering(l.work.rid, len(l.work.input_ids))) for l in lives]
        lengths = [len(it.token_ids) for it in items]
        bucketed = self._use_bucket(queue, lengths)
        if self.on_prefill_start is not None:
            # Before the forward pass, which can take seconds: the batch has left the queues,
            # and readers of the snapshot (/get_load) must still see its work as pending.
            self.on_prefill_start(len(batch), sum(item.uncached for item in batch))
        started = time.monotonic()
        try:
            logits, stats = self.runner.forward(items, bucketed=bucketed)
        except Exception as exc:  # noqa: BLE001 - the forward pass itself: the batch cannot go on
            log.exception("prefill batch failed")
            for live in lives:
                self._fail(live.work.rid, f"prefill failed: {exc}")
            return
        for live in lives:  # the prompt's full pages now hold its KV: later prompts may share them
            self.kv.insert(live.work.rid, live.work.input_ids)
        tokens = self.sample(logits, [l.work.params for l in lives], [0] * len(lives))
        seconds = time.monotonic() - started
        self.scheduler.observe_prefill(batch, seconds)
        evicted, self._evicted_seen = self.kv.evicted_pages - self._evicted_seen, self.kv.evicted_pages
        record = PrefillRecord(cls=lives[0].cls if queue != "fifo" else None, size=len(lives),
                               real_tokens=stats.real_tokens, padded_tokens=stats.padded_tokens,
                               path=stats.path, bucketed=bucketed, seconds=seconds,
                               requests=[PrefillRequest(len(l.work.input_ids), l.cached, l.cls,
                                                        l.work.gateway_cls) for l in lives],
                               evicted_pages=evicted)
        if self.on_prefill is not None:
            self.on_prefill(record)
        for live, token in zip(lives, tokens):
            if isinstance(token, Exception):  # this request alone fails; its neighbours go on
                self._fail(live.work.rid, str(token), status=400)
            elif live.work.kind == "prefill":
                self._hand_off(live, token)
            else:
                self._take_token(live, token, first=True)

    def _use_bucket(self, queue: str | None, lengths: list[int]) -> bool:
        graphs = getattr(self.runner, "graphs", None) is not None
        return bucket_for_batch(self.grid, queue, lengths, mode=self.config.batch_prefill_graphs_mode,
                                graphs=graphs) is not None

    def _decode_once(self) -> None:
        rids = list(self._running)
        lives = [self._live[r] for r in rids]
        items = []
        for live in lives:
            pos = len(live.work.input_ids) + len(live.stop.output_ids) - 1
            items.append(ForwardItem(token_ids=[live.stop.output_ids[-1]], start_pos=pos,
                                     pages=self.kv.pages_covering(live.work.rid, pos + 1)))
        started = time.monotonic()
        try:
            logits, _ = self.runner.forward_decode(items)
        except Exception as exc:  # noqa: BLE001
            log.exception("decode step failed")
            for rid in rids:
                self._fail(rid, f"decode failed: {exc}")
            return
        tokens = self.sample(logits, [l.work.params for l in lives], [len(l.stop.output_ids) for l in lives])
        self.decode_cost.observe(len(items), time.monotonic() - started)
        self.steps += 1
        for live, token in zip(lives, tokens):
            if isinstance(token, Exception):
                self._fail(live.work.rid, str(token), status=400)
            else:
                self._take_token(live, token, first=False)

    def _take_token(self, live: _Live, token: int, *, first: bool) -> None:
        rid = live.work.rid
        text = live.stop.add(token)
        out = EngineOutput(rid, token_ids=[token], text=text, prompt_tokens=len(live.work.input_ids),
                           completion_tokens=len(live.stop.output_ids), cached_tokens=live.cached,
                           cls=live.cls)
        if first:
            out.ttft_s = time.monotonic() - live.work.arrival
            if self.on_first_token is not None:
                self.on_first_token(live.cls, out.ttft_s)
        # The reservation is the sequence's whole budget (prompt + max_new, capped by the context
        # and the pool: kv_reservation), so prompt + completion never passes the context, as in
        # OpenAI, vLLM and SGLang. The last token's KV is never computed: one slot stays spare.
        full = len(live.work.input_ids) + len(live.stop.output_ids) >= self.kv.tokens(rid)
        if live.stop.finished or full:
            if not live.stop.finished:
                out.text += live.stop.end("length", None)
            out.finished = True
            out.finish_reason = live.stop.finish_reason
            out.matched_stop = live.stop.matched_stop
            # Cache the answer too (every position but the last token's, whose KV was never
            # computed): a chat's next turn re-sends it. Where the re-sent text tokenizes
            # differently from what was generated, the match simply ends there.
            self.kv.insert(rid, list(live.work.input_ids) + live.stop.output_ids[:-1])
            self._release(rid)
        elif first:
            self._running.append(rid)
        self._emit(live, out)

    def _hand_off(self, live: _Live, token: int) -> None:
        """Prefill role: the prompt's KV goes to the decode engine with the first token; this
        engine is done with the request."""
        rid = live.work.rid
        try:
            kv = self.pd.export(rid, len(live.work.input_ids))
        except Exception as exc:  # noqa: BLE001
            log.exception("KV export failed for %s", rid)
            self._fail(rid, f"KV export failed: {exc}")
            return
        self._live.pop(rid, None)
        ttft = time.monotonic() - live.work.arrival
        if self.on_first_token is not None:
            self.on_first_token(live.cls, ttft)
        self._emit(live, EngineOutput(
            rid, token_ids=[token], text=self._decode_text([token]), finished=True,
            finish_reason="prefilled", prompt_tokens=len(live.work.input_ids), completion_tokens=1,
            cached_tokens=live.cached, kv=kv, ttft_s=ttft, cls=live.cls))

    def _release(self, rid: str) -> None:
        self.kv.free(rid)
        self._live.pop(rid, None)
        if rid in self._running:
            self._running.remove(rid)

    def _fail(self, rid: str, message: str, status: int = 500) -> None:
        live = self._live.get(rid)
        self.scheduler.abort(rid)
        self.pd.forget(rid)
        self._release(rid)
        if live is not None:
            self._emit(live, EngineOutput(rid, finished=True, finish_reason="error", error=message,
                                          error_status=status))

    def _emit(self, live: _Live, out: EngineOutput) -> None:
        try:
            live.sink(out)
        except Exception:  # noqa: BLE001 - a broken consumer must not stop the loop
            # The client's id, which the gateway logs too; the rid is only this engine's.
            log.exception("request %s: output sink failed (engine rid %s)", live.work.request_id, out.rid)

    def _decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

