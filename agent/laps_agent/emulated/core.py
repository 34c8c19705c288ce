"""The engine model: what one engine does over time, without computing anything.

A pure state machine on the caller's clock. The emulated engine drives it with the wall clock
(it sleeps until `next_time()`), `laps sim` with a virtual one; both therefore share every
decision. It mirrors the builtin engine's loop (engine.py / engine_core.py) step for step:

  one iteration = admit decode requests whose KV arrived (their first token goes out at once)
                  -> at most ONE prefill batch, chosen by the real `PrefillScheduler`
                     (only while fewer than max_running requests decode)
                  -> ONE decode step for every running request.

Only durations differ: a prefill batch takes what prefill_cost.py prices for its uncached tokens
(a `PrefixCacheModel` says what is cached), a decode step `profile.decode_seconds(batch, context
tokens)`. KV is counted in pages with the builtin engine's reservation rule (`kv_reservation`); a
batch that does not fit goes back to the head of its queue (`requeue`), an import waits at the
head of the import queue.

Requests in, events out: requests.py. With `token_events=False` (the simulator) decode steps
report only finished requests, so a step costs O(finished), not O(running).

Why not the builtin engine's EngineCore (engine/core/engine_core.py): it runs each step to its end on a runner (forward
passes, sampling, stop strings, KV page ids); this model has no runner and runs on the caller's clock (a phase ends at
`busy_until`, KV is page counts, decode O(finished)). Shared: PrefillScheduler, kv_reservation, WarmQueue, buckets.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence

from laps_agent.emulated.prefill_cost import prefill_batch_cost, prefill_record
from laps_agent.emulated.prefix_cache import PrefixCacheModel
from laps_agent.emulated.profile import Profile
from laps_agent.emulated.requests import KINDS, Event, ModelRequest
from laps_agent.engine.core.config import PrefillRecord, kv_reservation
from laps_agent.engine.core.warm_queue import Warm, WarmQueue
from laps_agent.modelio.prompt_rules import over_context_message
from laps_agent.policy.scheduling.buckets import BucketGrid
from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_agent.policy.scheduling.decode_order import DecodeOrder, next_admitted
from laps_agent.policy.scheduling.queues import PrefillItem, PrefillScheduler
from laps_agent.policy.scheduling.window import PrefillCostModel

_IDLE, _PREFILL, _DECODE, _WARM = 0, 1, 2, 3


class EngineModel:
    def __init__(self, profile: Profile, role: str, scheduler: SchedulerConfig,
                 grid: BucketGrid | None = None, *, batch_prefill_graphs_mode: str = "auto",
                 max_running: int | None = None, kv_pages: int | None = None,
                 context_len: int | None = None, token_events: bool = True,
                 on_prefill: Callable[[PrefillRecord], None] | None = None,
                 prefix_cache: PrefixCacheModel | None = None,
                 on_warm: Callable[[str, int], None] | None = None,
                 decode_order: DecodeOrder | None = None) -> None:
        self.profile, self.role = profile, role
        # Which import takes a free decode slot: by deadline (decode_order.py), None: FIFO.
        self.decode_order = decode_order
        self.scheduler = PrefillScheduler(scheduler, grid)
        self.grid, self.batch_prefill_graphs_mode = grid, batch_prefill_graphs_mode
        self.max_running = max_running or profile.engine.max_running_requests
        self.page_size = profile.engine.page_size
        self.num_pages = kv_pages or profile.kv_capacity_pages()
        self.context_len = min(context_len or profile.engine.context_length, profile.engine.context_length)
        self.token_events, self.on_prefill, self.prefix_cache = token_events, on_prefill, prefix_cache
        self.free_pages, self._tie, self.step = self.num_pages, 0, 0        # step: decode steps done
        self.requests: dict[str, ModelRequest] = {}
        self.running: dict[str, ModelRequest] = {}
        self.imports: deque[str] = deque()
        # Prefix warms, at the lowest priority (engine/pd/prefix_warm.py), as the builtin engine.
        self.warms = WarmQueue(self.page_size, scheduler.length_threshold, on_warm)
        self._finishing: list[tuple[int, int, str]] = []   # (finish step, tie, rid)
        self._sum_prompt = self._sum_start = 0              # over running: context bookkeeping
        self._stage, self._batch = _IDLE, []
        self._cost: tuple[list[PrefillItem], float] = ([], 0.0)  # the running prefill's, observed at its end
        self.busy_until: float | None = None
        self.wake_at: float | None = None
        self.busy_seconds = 0.0                             # modelled compute time, for utilisation
        self.decode_cost = PrefillCostModel()               # its decode steps, fitted as the builtin's
        self.warm_seconds = 0.0                             # of which prefix warms (no request waits on them)

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def max_prompt_tokens(self) -> int:
        """Longest prompt this engine takes (as the builtin engine: leave room for one token)."""
        return min(self.context_len, self.capacity_tokens) - 1

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    # ---- input -------------------------------------------------------------------------------
    def add(self, req: ModelRequest, now: float) -> list[Event]:
        """Take a request (for kind "decode": its KV has arrived). Call `poll(now)` after."""
        if req.rid in self.requests:
            return [Event(req.rid, "error", now, error=f"request id {req.rid!r} is already in use")]
        if req.kind not in KINDS:
            return [Event(req.rid, "error", now, error=f"unknown request kind {req.kind!r}")]
        if req.prompt_tokens < 1:
            return [Event(req.rid, "error", now, error="the prompt is empty")]
        if req.prompt_tokens > self.max_prompt_tokens():  # the builtin engine's refusal, word for word
            return [Event(req.rid, "error", now,
                          error=over_context_message(req.prompt_tokens, self.max_prompt_tokens()))]
        reserve = kv_reservation(req.kind, req.prompt_tokens, req.max_new_tokens, self.context_len,
                                 self.capacity_tokens)
        # As the builtin engine: a sequence stops when prompt + output reaches its reservation
        # (the prompt check above leaves room for at least the first token).
        req.outputs = 1 if req.kind == "prefill" else max(1, min(req.max_new_tokens, reserve - req.prompt_tokens))
        req.pages = 0
        self.requests[req.rid] = req
        if req.kind == "decode":
            req.cls = req.cls or self.scheduler.classify(req.prompt_tokens - req.cached_tokens)
            if self.decode_order is not None:
                req.due = self.decode_order.deadline(req.arrival, req.prompt_tokens)
            self.imports.append(req.rid)
        else:  # classified, as the builtin engine, by what is not cached here
            if self.prefix_cache is not None:
                req.cached_tokens = self.prefix_cache.cached_tokens(req.blocks, req.prompt_tokens)
            item = PrefillItem(req.rid, req.prompt_tokens, req.cached_tokens, req.arrival)
            req.cls = self.scheduler.add(item, now)
        return []

    def abort(self, rid: str) -> bool:
        req = self.requests.pop(rid, None)
        if req is None:
            return False
        self.scheduler.abort(rid)
        if rid in self.running:
            self._leave_running(req)
        elif rid in self.imports:
            self.imports.remove(rid)
        self.free_pages += req.pages
        req.pages = 0
        return True

    # ---- time --------------------------------------------------------------------------------
    def next_time(self) -> float | None:
        """When `poll` has something to do without new input: the end of the running phase, or
        the end of the scheduler's waiting window; None when idle."""
        return self.busy_until if self.busy_until is not None else self.wake_at

    def poll(self, now: float) -> list[Event]:
        events: list[Event] = []
        while self.busy_until is not None and self.busy_until <= now:
            t, self.busy_until = self.busy_until, None
            self._finish_phase(t, events)
            if self.busy_until is None:
                self._start_iteration(t, events)
        if self.busy_until is None:
            self._start_iteration(now, events)
        return events

    # ---- phases ------------------------------------------------------------------------------
    def _start_iteration(self, t: float, events: list[Event]) -> None:
        self.wake_at = None
        self._admit_imports(t, events)
        if len(self.running) < self.max_running and len(self.scheduler) and self._start_prefill(t):
            return
        if self.running:
            self._start_decode(t)
        elif self.warms and not len(self.scheduler) and not self.imports:
            self._start_warm(t)

    def warm(self, blocks: Sequence[int], tokens: int) -> None:
        """A prefix warm of these KV-page keys (prompt + answer of `tokens` tokens)."""
        if self.prefix_cache is None or not blocks:
            self.warms.report("refused", 0)
        else:
            self.warms.add(Warm(blocks, tokens))

    def _start_warm(self, t: float) -> None:
        ps = self.page_size
        chunk = self.warms.next_chunk(lambda w: self.prefix_cache.peek(w.ids) * ps)
        if chunk is None:
            return
        warm, _, end = chunk
        if self._pages_for(end) > self.free_pages:
            self.warms.drop("dropped")
            return
        blocks = warm.ids[:end // ps]
        cached = min(self.prefix_cache.peek(blocks) * ps, end - ps)  # the builtin's match cap
        self.warms.advance(warm, end, end - cached)
        seconds = self.profile.prefill_seconds([end - cached], [cached])
        self.warm_seconds += seconds
        self._batch = [blocks]
        self._begin(_WARM, t, seconds)

    def _admit_imports(self, t: float, events: list[Event]) -> None:
        while self.imports and len(self.running) < self.max_running:
            rid = (self.imports[0] if self.decode_order is None
                   else next_admitted(self.imports, lambda r: self.requests[r].due, t))
            req = self.requests[rid]
            pages = self._pages_for(kv_reservation("decode", req.prompt_tokens, req.max_new_tokens,
                                                   self.context_len, self.capacity_tokens))
            if pages > self.free_pages:
                return
            self.imports.remove(rid)
            self.free_pages -= pages
            req.pages = pages
            self._first_token(req, t, events)

    def _start_prefill(self, t: float) -> bool:
        decision = self.scheduler.next_batch(t)
        if not decision.batch:
            self.wake_at = decision.wake_at
            return False
        batch: list[ModelRequest] = []
        items: list[PrefillItem] = []
        for i, item in enumerate(decision.batch):
            req = self.requests.get(item.rid)
            if req is None:
                continue
            pages = self._pages_for(kv_reservation(req.kind, req.prompt_tokens, req.max_new_tokens,
                                                   self.context_len, self.capacity_tokens))
            if pages > self.free_pages:
                # Out of pages: the rest go back to the head of their queue with their waiting
                # time, while decode finishes requests and frees pages (as the builtin engine).
                self.scheduler.requeue([r for r in decision.batch[i:] if r.rid in self.requests], t)
                break
            self.free_pages -= pages
            req.pages = pages
            batch.append(req)
            items.append(item)
        if not batch:
            return False
        uncached = [max(1, r.prompt_tokens - r.cached_tokens) for r in batch]
        seconds, bucket = prefill_batch_cost(self.profile, self.grid, decision.queue, uncached,
                                             [r.cached_tokens for r in batch], self.batch_prefill_graphs_mode)
        self._cost = (items, seconds)  # the cost model learns it when the batch ends, as the builtin's
        if self.on_prefill is not None:
            self.on_prefill(prefill_record(decision.queue, uncached, bucket, seconds, self.profile.graphs, batch))
        self._batch = batch
        self._begin(_PREFILL, t, seconds)
        return True

    def _start_decode(self, t: float) -> None:
        n = len(self.running)
        context = self._sum_prompt + n * (1 + self.step) - self._sum_start
        seconds = self.profile.decode_seconds(n, context)
        self.decode_cost.observe(n, seconds)
        self._begin(_DECODE, t, seconds)

    def _begin(self, stage: int, t: float, seconds: float) -> None:
        self._stage, self.busy_until = stage, t + seconds
        self.busy_seconds += seconds

    def _finish_phase(self, t: float, events: list[Event]) -> None:
        stage, self._stage = self._stage, _IDLE
        if stage == _PREFILL:
            batch, self._batch = self._batch, []
            self.scheduler.observe_prefill(*self._cost)
            for req in batch:
                if self.requests.get(req.rid) is not req:
                    continue  # aborted while its batch ran
                if self.prefix_cache is not None:  # its KV is computed: the cache keeps it
                    self.prefix_cache.insert(req.blocks)
                if req.kind == "prefill":
                    self._release(req)
                    events.append(Event(req.rid, "prefilled", t, 1, True, cls=req.cls))
                else:
                    self._first_token(req, t, events)
            if self.running:  # the same iteration goes on with a decode step (new ones included)
                self._start_decode(t)
        elif stage == _WARM:
            batch, self._batch = self._batch, []
            for blocks in batch:
                self.prefix_cache.insert(blocks)
        elif stage == _DECODE:
            self.step += 1
            if self.token_events:
                for req in self.running.values():
                    done = self.step - req.start_step + 1
                    if done < req.outputs:
                        events.append(Event(req.rid, "token", t, done, cls=req.cls))
            while self._finishing and self._finishing[0][0] <= self.step:
                _, _, rid = heapq.heappop(self._finishing)
                req = self.running.get(rid)
                if req is None or req.start_step + req.outputs - 1 != self.step:
                    continue  # aborted (a stale heap entry)
                self._leave_running(req)
                self._release(req)
                events.append(Event(rid, "token", t, req.outputs, True, cls=req.cls))

    # ---- bookkeeping -------------------------------------------------------------------------
    def _first_token(self, req: ModelRequest, t: float, events: list[Event]) -> None:
        if req.outputs <= 1:
            self._release(req)
            events.append(Event(req.rid, "token", t, 1, True, cls=req.cls))
            return
        events.append(Event(req.rid, "token", t, 1, cls=req.cls))
        req.start_step = self.step
        self.running[req.rid] = req
        self._sum_prompt += req.prompt_tokens
        self._sum_start += req.start_step
        self._tie += 1
        heapq.heappush(self._finishing, (req.start_step + req.outputs - 1, self._tie, req.rid))

    def _leave_running(self, req: ModelRequest) -> None:
        del self.running[req.rid]
        self._sum_prompt -= req.prompt_tokens
        self._sum_start -= req.start_step

    def _release(self, req: ModelRequest) -> None:
        self.requests.pop(req.rid, None)
        self.free_pages += req.pages
        req.pages = 0

    # ---- views -------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The same shape as the builtin engine's snapshot (metrics and /get_server_info)."""
        batch = self._batch if self._stage == _PREFILL else ()
        return {"running": len(self.running), "queues": self.scheduler.pending(),
                "prefilling": (len(batch), sum(max(1, r.prompt_tokens - r.cached_tokens) for r in batch)),
                "kv_usage": 1.0 - self.free_pages / self.num_pages, "waiting_kv": len(self.imports),
                "prefix_cache_pages": len(self.prefix_cache) if self.prefix_cache is not None else 0,
                "live": len(self.requests), "prefill_cost": self.scheduler.prefill_cost(),
                "decode_cost": self.decode_cost.linear(),
                "max_prefill_tokens": self.scheduler.config.max_prefill_tokens,
                "max_long_batch_tokens": self.scheduler.config.max_long_batch_tokens}
