"""The engine's single-threaded state machine: admission, prefill batches, decode steps, PD
hand-off, stop handling. Everything here runs on the engine thread only (see engine.py). The PD
steps (KV import and export) and prefix warming are in engine_core_pd.py."""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from laps_agent.engine.core.config import EngineConfig, PrefillRecord, PrefillRequest, kv_reservation
from laps_agent.engine.core.engine_core_pd import PDSteps
from laps_agent.engine.core.kv_cache import KVCacheFull, PagedKVAllocator
from laps_agent.engine.core.requests import EngineOutput, GenerateWork, OutputSink
from laps_agent.engine.model.runner import ForwardItem
from laps_agent.engine.model.sampling import StopState, sample_each
from laps_agent.engine.pd.prefix_warm import Warm, WarmQueue
from laps_agent.policy.classes import length_class
from laps_agent.policy.scheduling.buckets import bucket_for_batch
from laps_agent.policy.scheduling.queues import PrefillItem, PrefillScheduler

log = logging.getLogger("laps_agent.engine.engine")


@dataclass
class _Live:
    work: GenerateWork
    sink: OutputSink
    stop: StopState
    cls: str
    cached: int = 0   # prompt tokens whose KV came from the prefix cache (known after allocation)


class EngineCore(PDSteps):
    """One engine's loop state; the steps of work crossing engines (PD, warms) are PDSteps'."""

    def __init__(self, runner: Any, tokenizer: Any, config: EngineConfig, *, grid: Any = None,
                 on_prefill: Callable[[PrefillRecord], None] | None = None,
                 on_first_token: Callable[[str, float], None] | None = None,
                 on_warm: Callable[[str, int], None] | None = None) -> None:
        self.runner, self.tokenizer, self.config = runner, tokenizer, config
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
        # Prefill role: warms, at the lowest priority (prefix_warm.py).
        self.warms = WarmQueue(runner.page_size, config.scheduler.length_threshold, on_warm)
        self._live: dict[str, _Live] = {}
        self._running: list[str] = []          # decoding, in admission order
        self._imports: deque[str] = deque()    # decode role: KV arrived, waiting for pages
        self.steps = 0

    def max_prompt_tokens(self) -> int:
        """Longest prompt this engine can take: prompt + completion must fit the context and the
        KV pool, and a request always gets at least one new token."""
        return min(self.config.context_len, self.kv.capacity_tokens) - 1

    def _accept(self, work: GenerateWork, sink: OutputSink) -> None:
        if work.kind == "warm":
            if self.kv.cache is None:
                self.warms.report("refused", 0)
            else:
                self.warms.add(Warm(list(work.input_ids), len(work.input_ids), work.rid))
            return
        if work.rid in self._live:
            sink(EngineOutput(work.rid, finished=True, finish_reason="error", error_status=400,
                              error=f"request id {work.rid!r} is already in use"))
            return
        stop = StopState(work.params, self.eos_ids, self._decode_text, context=work.input_ids)
        live = _Live(work, sink, stop, cls=self._classify(len(work.input_ids)), cached=work.cached_tokens)
        self._live[work.rid] = live
        if work.kind == "decode":
            self._imports.append(work.rid)
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

    def _abort(self, rid: str) -> None:
        live = self._live.pop(rid, None)
        if live is None:
            return
        self.scheduler.abort(rid)
        if rid in self._running:
            self._running.remove(rid)
        if rid in self._imports:
            self._imports.remove(rid)
        self.kv.free(rid)
        self._emit(live, EngineOutput(rid, finished=True, finish_reason="abort"))

    def _reserve_tokens(self, work: GenerateWork) -> int:
        return kv_reservation(work.kind, len(work.input_ids), work.params.max_new_tokens,
                              self.config.context_len, self.kv.capacity_tokens)

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
                             pages=self._pages(l.work.rid, len(l.work.input_ids))) for l in lives]
        lengths = [len(it.token_ids) for it in items]
        bucketed = self._use_bucket(queue, lengths)
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
        tokens = sample_each(logits, [l.work.params for l in lives], [0] * len(lives))
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
                                     pages=self._pages(live.work.rid, pos + 1)))
        try:
            logits, _ = self.runner.forward_decode(items)
        except Exception as exc:  # noqa: BLE001
            log.exception("decode step failed")
            for rid in rids:
                self._fail(rid, f"decode failed: {exc}")
            return
        tokens = sample_each(logits, [l.work.params for l in lives], [len(l.stop.output_ids) for l in lives])
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

    def _pages(self, rid: str, tokens: int) -> list[int]:
        return self.kv.pages(rid)[: self.kv.pages_for(tokens)]

    def _release(self, rid: str) -> None:
        self.kv.free(rid)
        self._live.pop(rid, None)
        if rid in self._running:
            self._running.remove(rid)

    def _fail(self, rid: str, message: str, status: int = 500) -> None:
        live = self._live.get(rid)
        self.scheduler.abort(rid)
        if rid in self._imports:
            self._imports.remove(rid)
        self._release(rid)
        if live is not None:
            self._emit(live, EngineOutput(rid, finished=True, finish_reason="error", error=message,
                                          error_status=status))

    def _fail_all(self, message: str) -> None:
        for rid in list(self._live):
            self._fail(rid, message)

    def _emit(self, live: _Live, out: EngineOutput) -> None:
        try:
            live.sink(out)
        except Exception:  # noqa: BLE001 - a broken consumer must not stop the loop
            # The client's id, which the gateway logs too; the rid is only this engine's.
            log.exception("request %s: output sink failed (engine rid %s)", live.work.request_id, out.rid)

    def _decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

