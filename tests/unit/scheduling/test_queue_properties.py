"""Property tests of the dual-queue scheduler over arbitrary interleavings of add/abort/next_batch."""
from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from laps_agent.policy.classes import CLASSES
from laps_agent.policy.scheduling import BucketGrid, PrefillItem, PrefillScheduler, SchedulerConfig

configs = st.builds(
    SchedulerConfig,
    enabled=st.booleans(),
    length_threshold=st.sampled_from([16, 64, 256]),
    wait_window_ms=st.sampled_from([0.0, 1.0, 5.0, 50.0]),
    wait_max_batch=st.integers(1, 8),
    adaptive_window=st.booleans(),
    max_long_wait_ms=st.sampled_from([0.0, 10.0, 100.0, 2000.0]),
    max_batch_size=st.integers(1, 8),
    max_prefill_tokens=st.sampled_from([64, 512, 8192]),
)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 1200), st.integers(0, 1200)),  # prompt, cached
        st.tuples(st.just("abort"), st.integers(0, 60), st.just(0)),            # index of a rid
        st.tuples(st.just("next"), st.just(0), st.just(0)),
        st.tuples(st.just("next_requeue"), st.integers(0, 8), st.just(0)),     # put back a suffix
        st.tuples(st.just("tick"), st.integers(0, 200), st.just(0)),            # advance ms
        st.tuples(st.just("observe"), st.integers(1, 4000), st.integers(0, 500)),  # tokens, ms
    ),
    max_size=80,
)


@dataclass
class Model:
    """What a user of the scheduler can know from its own calls."""
    queued: dict[str, tuple[str, float]] = field(default_factory=dict)   # rid -> (class, enqueued)
    order: dict[str, list[str]] = field(default_factory=lambda: {"short": [], "long": []})
    dispatched: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    dispatched_info: dict[str, tuple[str, float]] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)


def run(config: SchedulerConfig, operations, grid=None):
    sched = PrefillScheduler(config, grid)
    model, now, rid_count = Model(), 0.0, 0
    for op, a, b in operations:
        if op == "add":
            rid = f"r{rid_count}"
            rid_count += 1
            cls = sched.add(PrefillItem(rid, prompt_tokens=a, cached_tokens=min(b, a)), now)
            assert cls == ("short" if max(1, a - min(b, a)) <= config.length_threshold else "long")
            model.queued[rid] = (cls, now)
            model.order[cls].append(rid)
            model.added.append(rid)
        elif op == "abort":
            rid = f"r{a}"
            expected = rid in model.queued
            assert sched.abort(rid) is expected
            if expected:
                del model.queued[rid]
                model.aborted.append(rid)
        elif op == "tick":
            now += a / 1000.0
        elif op == "observe":
            sched.observe_prefill([PrefillItem("x", a)], b / 1000.0)
        else:
            batch = check_decision(config, sched, model, now)
            if op == "next_requeue" and batch:
                back = batch[len(batch) - min(a, len(batch)):]
                sched.requeue(back, now)
                for item in back:   # back at the head, original class and waiting time
                    model.queued[item.rid] = model.dispatched_info.pop(item.rid)
                    model.dispatched.remove(item.rid)
        assert len(sched) == len(model.queued)
        pending = sched.pending()
        for cls in CLASSES:
            assert pending[cls][0] == sum(1 for c, _ in model.queued.values() if c == cls)
    return sched, model


def check_decision(config, sched, model, now):
    oldest = {cls: next((r for r in model.order[cls] if r in model.queued), None) for cls in CLASSES}
    decision = sched.next_batch(now)
    batch = [item.rid for item in decision.batch]
    if not model.queued:
        assert batch == [] and decision.wake_at is None
        return []
    if not batch:  # only the window may hold, and only short requests, and not past the window
        assert config.enabled and oldest["long"] is None and decision.wake_at is not None
        setting = sched.window_setting()
        short_enqueued = model.queued[oldest["short"]][1]
        assert now < decision.wake_at == short_enqueued + setting.window_s
        assert len(model.queued) < setting.target_depth
        return []
    assert decision.wake_at is None
    assert len(batch) <= config.max_batch_size
    if len(batch) > 1:
        assert sum(item.uncached for item in decision.batch) <= config.max_prefill_tokens
    assert all(rid in model.queued for rid in batch) and len(set(batch)) == len(batch)
    classes = {model.queued[rid][0] for rid in batch}
    if config.enabled:
        assert classes == {decision.queue}
        # starvation bound: an overdue oldest long request is in this very batch
        if oldest["long"] is not None and now >= model.queued[oldest["long"]][1] + config.max_long_wait_s:
            assert oldest["long"] in batch
        # FIFO within the class: the batch is the head of that class's queue
        waiting = [r for r in model.order[decision.queue] if r in model.queued]
        assert batch == waiting[: len(batch)]
    else:
        assert decision.queue == "fifo"
        waiting = [r for r in model.added if r in model.queued]
        assert batch == waiting[: len(batch)]
    model.dispatched_info = {}
    for rid in batch:
        model.dispatched_info[rid] = model.queued.pop(rid)
        model.dispatched.append(rid)
    return decision.batch


@settings(deadline=None, max_examples=300)
@given(config=configs, operations=ops)
def test_no_request_lost_or_duplicated_and_fifo_within_class(config, operations):
    sched, model = run(config, operations)
    # drain: everything still queued comes out exactly once
    now = 1e6
    while len(sched):
        check_decision(config, sched, model, now)
        now += 1.0
    assert sched.next_batch(now).batch == []
    assert sorted(model.dispatched + model.aborted) == sorted(model.added)
    assert len(set(model.dispatched)) == len(model.dispatched)
    assert sched.pending() == {"short": (0, 0), "long": (0, 0)}


@settings(deadline=None, max_examples=150)
@given(config=configs, operations=ops, grid_max=st.integers(1, 8))
def test_window_setting_stays_within_its_bounds(config, operations, grid_max):
    sched, _ = run(config, operations, BucketGrid([1, grid_max], [64]))
    setting = sched.window_setting()
    factor = config.adaptive_window_factor if config.adaptive_window else 1.0
    assert 0.0 <= setting.window_s <= config.wait_window_s * factor + 1e-12
    assert 1 <= setting.target_depth <= min(config.max_batch_size, grid_max)


arrivals = st.lists(
    st.tuples(st.integers(0, 30), st.sampled_from([8, 32, 100, 300, 1000, 2000])),  # gap ms, tokens
    min_size=1, max_size=60,
)


@settings(deadline=None, max_examples=150)
@given(arrivals=arrivals, batch_ms=st.integers(1, 80), max_long_wait_ms=st.sampled_from([0, 20, 100, 300]),
       window_ms=st.sampled_from([0.0, 5.0, 40.0]), adaptive=st.booleans())
def test_long_wait_is_bounded_in_a_simulated_engine(arrivals, batch_ms, max_long_wait_ms, window_ms, adaptive):
    """Driver loop of an engine whose batches take <= D: a long request with k long requests ahead
    of it waits at most max_long_wait + (k + 1) * D, however many short requests keep arriving."""
    config = SchedulerConfig(length_threshold=256, wait_window_ms=window_ms, adaptive_window=adaptive,
                             max_long_wait_ms=max_long_wait_ms, max_batch_size=4, max_prefill_tokens=4096)
    sched = PrefillScheduler(config)
    duration = batch_ms / 1000.0
    times, t = [], 0.0
    for gap, _ in arrivals:
        t += gap / 1000.0
        times.append(t)
    arrived_at, ahead, dispatched_at = {}, {}, {}
    now, i, steps = 0.0, 0, 0
    while i < len(arrivals) or len(sched):
        steps += 1
        assert steps < 10 * len(arrivals) + 10, "the scheduler stopped making progress"
        while i < len(arrivals) and times[i] <= now:
            rid = f"r{i}"
            if sched.add(PrefillItem(rid, arrivals[i][1]), times[i]) == "long":
                ahead[rid] = sched.pending()["long"][0] - 1
            arrived_at[rid] = times[i]
            i += 1
        decision = sched.next_batch(now)
        if decision.batch:
            for item in decision.batch:
                dispatched_at[item.rid] = now
            # the batch's real duration varies; D bounds it
            took = duration * (0.5 + 0.5 * (len(decision.batch) % 2))
            sched.observe_prefill(decision.batch, took)
            now += took
        else:
            upcoming = [times[i]] if i < len(arrivals) else []
            if decision.wake_at is not None:
                upcoming.append(decision.wake_at)
            now = max(now, min(upcoming))
    for rid, k in ahead.items():
        waited = dispatched_at[rid] - arrived_at[rid]
        assert waited <= max_long_wait_ms / 1000.0 + (k + 1) * duration + 1e-9, (rid, k, waited)
