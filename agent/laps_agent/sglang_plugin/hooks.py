"""The SGLang half of the plugin: three hooks on SGLang's scheduler and one on its tokenizer side
(the methods are named in compat.py, HOOK_*; __init__.py registers these functions on them).

* AROUND `Scheduler._get_new_batch_prefill_raw` (HOOK_NEW_BATCH) — the reference fork's queue-swap point. SGLang
  builds a prefill batch from `self.waiting_queue` (PrefillAdder: memory, token budget, chunked
  prefill). The hook shows it only the requests LAPS chose (`QueueDriver.choose`), lets SGLang
  build the batch from them exactly as it would, then puts back the union of both LAPS queues
  (plus anything SGLang itself queued meanwhile) and requeues what SGLang could not admit. When
  the waiting window holds short requests it returns "no batch", as SGLang does with an empty
  queue; a chunked prefill in progress still advances then (SGLang carries it outside the queue).
* AFTER `process_batch_result_disagg_prefill` (HOOK_BATCH_RESULT) — a batch's prefill ended: time to first token by
  class, batch latency and size (metrics), and the cost model the window rules use.
* BEFORE `_get_new_prebuilt_batch` (HOOK_DECODE_ADMIT), on a decode server — SGLang takes the
  first requests of `waiting_queue` (KV arrived) into its running batch while slots are free;
  the hook puts them in first-token deadline order first (`decode_queue_order`), as the builtin
  engine's decode role admits them.

The gauges (queues, running requests, KV usage, the pod's group) are set on every scheduler
pass, in the first hook: SGLang calls it on each pass, idle ones included, so they fall back to
0 once a burst is over (set only after a batch, they kept the last batch's load while idle).

Each Scheduler gets its state on first use (`_state`): only prefill-mode schedulers with the
plugin enabled and pipeline parallelism off; all others take the original code path untouched.
With tensor parallelism every rank runs this loop and all must build the same batch, so rank 0
decides and broadcasts the chosen request ids (decisions depend on the clock).
"""
from __future__ import annotations

import json
import logging
import os
import time

from laps_agent.policy.classes import SHORT
from laps_agent.policy.scheduling.decode_order import DecodeOrder, admission_order
from laps_agent.sglang_plugin.compat import ARRIVAL_FIELDS
from laps_agent.sglang_plugin.driver import QueueDriver
from laps_agent.sglang_plugin.settings import PluginSettings

log = logging.getLogger("laps.sglang_plugin")
_STATE_ATTR = "_laps_plugin_state"
_DECODE_ATTR = "_laps_plugin_decode_order"
_OFF = object()  # this scheduler runs vanilla


def _arrival(req) -> float:
    """When the server got the request, on perf_counter (the hooks' `now`). The scheduler loop
    reads new requests only between batches, so its own receive time can be seconds late behind
    a long prefill; the tokenizer process's dispatch time (propagated with the request) is the
    HTTP-side arrival, as the builtin engine counts it. Implausible values (unset, another clock)
    fall back to the next candidate."""
    now = time.perf_counter()
    for name in ARRIVAL_FIELDS:
        value = float(getattr(req.time_stats, name, 0.0) or 0.0)
        if now - 3600.0 < value <= now:
            return value
    return now


class _State:
    def __init__(self, scheduler, settings: PluginSettings) -> None:
        from sglang.srt.mem_cache.common import match_kv_cache

        def token_counts(req) -> tuple[int, int]:
            prompt = len(req.origin_input_ids)
            # SGLang's own prefix match (what its LPM policy calls on waiting requests): sets
            # req.prefix_len to the cached prefix on the device, reads nothing else.
            match_kv_cache(req, scheduler.tree_cache, req.origin_input_ids + req.output_ids)
            return prompt, int(req.prefix_len)

        self.settings = settings
        self.driver = QueueDriver(settings.scheduler, token_counts, _arrival)
        self.tp = scheduler.tp_size > 1
        model = getattr(scheduler.server_args, "served_model_name", None) or ""
        # Every SGLang process imports this module (for send_arrival_stamps); the series are a scheduler's.
        # lazy: prometheus_client and the engine's series load only in a scheduler the plugin runs
        from laps_agent.sglang_plugin.metrics import PluginMetrics

        self.metrics = PluginMetrics(model, settings.labels_file)
        self.launched: dict[int, tuple[float, list[str], str]] = {}  # id(batch) -> (t, rids, cls)
        path = os.environ.get("LAPS_BATCH_LOG")
        # One JSON line per prefill batch (rids, class, reason): evidence for tests and debugging.
        self.batch_log = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def log_batch(self, record: dict) -> None:
        if self.batch_log is not None:
            self.batch_log.write(json.dumps(record) + "\n")


def _state(scheduler, settings: PluginSettings):
    state = scheduler.__dict__.get(_STATE_ATTR)
    if state is not None:
        return None if state is _OFF else state
    from sglang.srt.disaggregation.utils import DisaggregationMode

    state = _OFF
    if scheduler.disaggregation_mode != DisaggregationMode.PREFILL:
        log.info("LAPS scheduler inactive: not a prefill server (disaggregation mode %s)",
                 scheduler.disaggregation_mode.value)
    elif scheduler.server_args.pp_size > 1:
        log.warning("LAPS scheduler disabled: pipeline parallelism (pp_size=%d) is not supported",
                    scheduler.server_args.pp_size)
    else:
        state = _State(scheduler, settings)
        log.info("LAPS scheduler active: %s (from %s)", settings.scheduler, ", ".join(settings.sources))
    scheduler.__dict__[_STATE_ATTR] = state
    return None if state is _OFF else state


def _decode_order(scheduler, settings: PluginSettings) -> DecodeOrder | None:
    """The deadline order of a decode-mode scheduler with the plugin on (decided on first use);
    None for every other scheduler, which keeps SGLang's own order."""
    order = scheduler.__dict__.get(_DECODE_ATTR)
    if order is None:
        from sglang.srt.disaggregation.utils import DisaggregationMode

        order = _OFF
        if scheduler.disaggregation_mode == DisaggregationMode.DECODE and settings.decode_order is not None:
            if scheduler.server_args.pp_size > 1:
                log.warning("LAPS decode order disabled: pipeline parallelism (pp_size=%d) is not supported",
                            scheduler.server_args.pp_size)
            else:
                order = settings.decode_order
                log.info("LAPS decode order active: a free slot goes to the first token due first (TTFT SLO "
                         "%s, length threshold %d)", dict(order.ttft_slo_s), order.length_threshold)
        scheduler.__dict__[_DECODE_ATTR] = order
    return None if order is _OFF else order


def decode_queue_order(order: DecodeOrder, waiting: list, now: float) -> list:
    """A decode server's waiting requests (KV arrived) in the order they take free slots: those
    resumed after a retraction first (their first token went out long ago, and their KV is back
    in memory, waiting), then the rest by first-token deadline (decode_order.admission_order)."""
    resumed = [r for r in waiting if r.retraction_count > 0]
    fresh = [r for r in waiting if r.retraction_count <= 0]
    return resumed + admission_order(fresh, lambda r: order.deadline(_arrival(r), len(r.origin_input_ids)), now)


def _broadcast_choice(scheduler, chosen_rids):
    from sglang.srt.utils.common import broadcast_pyobj

    group = scheduler.tp_group
    return broadcast_pyobj([chosen_rids], group.rank, scheduler.tp_cpu_group, src=group.ranks[0])[0]


def send_arrival_stamps(state, stats, *args, **kwargs):
    """AFTER hook on the tokenizer side's time stats serialisation: also send the arrival
    stamps (perf_counter; SGLang's __setstate__ rebases fields ending in `time` across
    processes, and the scheduler's stats copy fields of the same name)."""
    state = dict(state)
    for name in ARRIVAL_FIELDS[:2]:
        value = getattr(stats, name, 0.0)
        if value:
            state[name] = value
    return state


def _set_gauges(state, scheduler, now: float) -> None:
    metrics = state.metrics
    metrics.set_queues(state.driver.pending())
    metrics.follow_group(now)
    try:
        # Running: prefilled requests whose KV is still on its way to the decode server.
        metrics.set_load(len(scheduler.disagg_prefill_inflight_queue),
                         scheduler.pool_stats_observer.get_pool_stats().get_max_pool_usage())
    except Exception:  # noqa: BLE001 - a metric must never break the scheduler loop
        log.debug("LAPS: could not read SGLang's pool stats", exc_info=True)


def make_hooks(settings: PluginSettings):
    def around_new_batch(original, self, *args, **kwargs):
        state = _state(self, settings)
        if state is None:
            return original(self, *args, **kwargs)
        driver, now = state.driver, time.perf_counter()
        driver.sync(self.waiting_queue, now)
        if state.tp:
            # Rank 0 decides; the others apply its choice (their queues hold the same requests).
            leader = self.tp_group.rank == self.tp_group.ranks[0]
            chosen = driver.choose(now) if leader else None
            rids = _broadcast_choice(self, [r.rid for r in chosen] if chosen else None)
            if not leader and rids:
                chosen = driver.take(rids)
        else:
            chosen = driver.choose(now)
        _set_gauges(state, self, now)
        decision = driver.last_decision
        if chosen is None:
            # Nothing to start now. SGLang must still run when it has work outside the queue: a
            # chunked prefill in progress, or grammar-constrained requests that became ready
            # (it queues those itself; they then join the LAPS queues at the next call).
            if self.chunked_req is None and not self.grammar_manager.has_waiting_grammars():
                return None, kwargs.get("running_batch", args[-1] if args else None)
            chosen = []
        chosen_rids = {r.rid for r in chosen}
        self.waiting_queue = list(chosen)
        try:
            result = original(self, *args, **kwargs)
        finally:
            leftover = self.waiting_queue
            driver.settle(chosen, leftover, now)
            extra = [r for r in leftover if r.rid not in chosen_rids]  # queued by SGLang meanwhile
            self.waiting_queue = driver.union() + extra
        batch = result[0]
        if batch is not None and chosen:
            cls = decision.queue if decision is not None else SHORT
            rids = [r.rid for r in batch.reqs]
            state.launched[id(batch)] = (time.perf_counter(), rids, cls)
            state.log_batch({"t": now, "queue": decision.queue if decision else None,
                             "reason": decision.reason if decision else None, "rids": rids,
                             "prompt_tokens": [len(r.origin_input_ids) for r in batch.reqs],
                             "waited_s": [round(now - driver.inflight[r.rid].arrival, 3)
                                          if r.rid in driver.inflight else None for r in batch.reqs]})
        return result

    def after_batch_result(result, self, batch, *args, **kwargs):
        state = self.__dict__.get(_STATE_ATTR)
        if state is None or state is _OFF:
            return None
        launched = state.launched.pop(id(batch), None)
        now = time.perf_counter()
        done = [r for r in batch.reqs if getattr(r, "inflight_middle_chunks", 0) <= 0]
        if launched is not None:
            started, rids, cls = launched
            seconds = now - started
            state.driver.observe_prefill(rids, seconds)
            state.metrics.observe_batch(cls, len(rids), seconds)
        for req in done:
            tracked = state.driver.finish(req.rid)
            if tracked is not None:
                state.metrics.observe_first_token(tracked.cls, now - tracked.arrival)
        return None

    def before_prebuilt_batch(self, *args, **kwargs):
        order = _decode_order(self, settings)
        if order is None or len(self.waiting_queue) < 2:
            return None
        ordered = decode_queue_order(order, self.waiting_queue, time.perf_counter())
        if self.tp_size > 1:
            # The order depends on the clock: rank 0 decides, the others apply it (their queues
            # hold the same requests), so every rank builds the same batch.
            leader = self.tp_group.rank == self.tp_group.ranks[0]
            rids = _broadcast_choice(self, [r.rid for r in ordered] if leader else None)
            if not leader:
                place = {rid: i for i, rid in enumerate(rids)}
                ordered = sorted(self.waiting_queue, key=lambda r: place.get(r.rid, len(place)))
        self.waiting_queue = ordered
        return None

    return around_new_batch, after_batch_result, before_prebuilt_batch
