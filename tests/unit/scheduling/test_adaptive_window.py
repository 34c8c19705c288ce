"""The adaptive wait-depth mode: window and target depth follow arrivals and batch costs."""
from __future__ import annotations

import pytest

from laps_agent.policy.scheduling import BucketGrid, PrefillItem, PrefillScheduler, SchedulerConfig
from laps_agent.policy.scheduling.window import PrefillCostModel


def feed_costs(sched, overhead_s, per_token_s):
    """The engine reports batches of varied sizes costing overhead + per_token * tokens."""
    for tokens in (20, 40, 80, 160, 20, 60):
        sched.observe_prefill([PrefillItem("x", tokens)], overhead_s + per_token_s * tokens)


def feed_arrivals(sched, gap_s, count=10, start=0.0):
    t = start
    for i in range(count):
        sched.add(PrefillItem(f"a{start}-{i}", 20), t)
        t += gap_s
    while len(sched):
        sched.next_batch(t + 10)
    return t


def test_cost_model_recovers_overhead_and_per_token_cost():
    model = PrefillCostModel()
    assert model.predict(100) is None
    model.observe(100, 0.02)
    assert model.coefficients() is None and model.predict(200) == pytest.approx(0.04)
    for tokens in (50, 300, 1000):
        model.observe(tokens, 0.01 + 0.0001 * tokens)
    overhead, per_token = model.coefficients()
    assert overhead == pytest.approx(0.01) and per_token == pytest.approx(0.0001)


def test_a_cost_that_does_not_grow_with_tokens_reads_as_overhead_alone():
    """A profile with a fixed cost per batch times both calibration prefills alike: rounding must
    not turn that into a per-token cost of 1e-19 s (and a pod admitting one request at a time)."""
    from laps_agent.engine.core.load_report import prefill_capacity

    model = PrefillCostModel()
    for tokens in (64, 1024):
        model.observe(tokens, 3600.0 + 0.1)
    assert model.coefficients() == (pytest.approx(3600.1), 0.0)
    assert prefill_capacity(model.linear(), 15.0) is None   # no figure: the token bound alone


def test_before_any_measurement_the_fixed_values_apply():
    sched = PrefillScheduler(SchedulerConfig(adaptive_window=True, wait_window_ms=5, wait_max_batch=6))
    setting = sched.window_setting()
    assert (setting.source, setting.window_s, setting.target_depth) == ("fixed", 0.005, 6)


def test_costly_batch_launches_and_dense_arrivals_make_it_wait_for_a_bigger_batch():
    config = SchedulerConfig(adaptive_window=True, wait_window_ms=5, wait_max_batch=2, max_batch_size=8)
    sched = PrefillScheduler(config, BucketGrid([1, 2, 4], [64]))
    feed_costs(sched, overhead_s=0.050, per_token_s=1e-5)
    feed_arrivals(sched, gap_s=0.002)
    setting = sched.window_setting()
    assert setting.source == "adaptive"
    assert setting.target_depth == 4                       # capped by the grid's largest bucket
    assert setting.window_s == pytest.approx(3 * 0.002, rel=0.05)   # time to collect 3 more


def test_no_launch_overhead_means_no_waiting():
    sched = PrefillScheduler(SchedulerConfig(adaptive_window=True, wait_window_ms=5))
    feed_costs(sched, overhead_s=0.0, per_token_s=1e-4)
    feed_arrivals(sched, gap_s=0.001)
    assert sched.window_setting().window_s == 0.0
    sched.add(PrefillItem("now", 20), 100.0)
    assert [i.rid for i in sched.next_batch(100.0).batch] == ["now"]


def test_sparse_arrivals_mean_no_waiting_and_dense_traffic_brings_the_window_back():
    sched = PrefillScheduler(SchedulerConfig(adaptive_window=True, wait_window_ms=5))
    feed_costs(sched, overhead_s=0.020, per_token_s=1e-5)
    t = feed_arrivals(sched, gap_s=1.0)
    assert sched.window_setting().target_depth == 1 and sched.window_setting().window_s == 0.0
    feed_arrivals(sched, gap_s=0.001, count=30, start=t + 1)
    assert sched.window_setting().target_depth > 1
    assert 0.0 < sched.window_setting().window_s <= 0.005 * 4


def test_adaptive_scheduler_batches_dense_short_traffic():
    sched = PrefillScheduler(SchedulerConfig(adaptive_window=True, wait_window_ms=5, max_batch_size=8))
    feed_costs(sched, overhead_s=0.050, per_token_s=1e-5)
    t = feed_arrivals(sched, gap_s=0.002)
    sizes = []
    for i in range(16):
        sched.add(PrefillItem(f"d{i}", 20), t)
        decision = sched.next_batch(t)
        if decision.batch:
            sizes.append(len(decision.batch))
        t += 0.002
    assert max(sizes) > 1


def queued_shorts(sched, lengths, now=50.0):
    for i, tokens in enumerate(lengths):
        sched.add(PrefillItem(f"q{i}", tokens), now)


def drain_batch_sizes(sched, now=50.0):
    sizes = []
    while len(sched):
        sizes.append(len(sched.next_batch(now).batch))
    return sizes


def summed_ttft(sizes, lengths, overhead, per_token):
    """Summed completion time of the queued requests when run in batches of these sizes."""
    clock, total, start = 0.0, 0.0, 0
    for size in sizes:
        clock += overhead + per_token * sum(lengths[start:start + size])
        total += clock * size
        start += size
    return total


def test_per_token_dominated_cost_splits_a_ready_short_batch_to_lower_mean_ttft():
    # CPU-like: prefill cost is almost all per-token, so running 8 prompts together makes the
    # first ones wait for the last; two batches of 4 finish the first half twice as early.
    lengths = [64, 60, 70, 58, 66, 62, 68, 64]
    sched = PrefillScheduler(SchedulerConfig(adaptive_window=True, wait_window_ms=0, max_batch_size=8))
    feed_costs(sched, overhead_s=0.002, per_token_s=0.0015)
    queued_shorts(sched, lengths)
    sizes = drain_batch_sizes(sched)
    assert sum(sizes) == 8 and sizes[0] < 8
    assert summed_ttft(sizes, lengths, 0.002, 0.0015) < summed_ttft([8], lengths, 0.002, 0.0015)


def test_overhead_dominated_cost_keeps_the_whole_short_batch():
    # GPU-like: a batch costs its launch, tokens are nearly free, so one batch is best.
    lengths = [64] * 8
    sched = PrefillScheduler(SchedulerConfig(adaptive_window=True, wait_window_ms=0, max_batch_size=8))
    feed_costs(sched, overhead_s=0.020, per_token_s=1e-6)
    queued_shorts(sched, lengths)
    assert drain_batch_sizes(sched) == [8]


def test_fixed_mode_never_splits():
    sched = PrefillScheduler(SchedulerConfig(adaptive_window=False, wait_window_ms=0, max_batch_size=8))
    feed_costs(sched, overhead_s=0.002, per_token_s=0.0015)
    queued_shorts(sched, [64] * 8)
    assert drain_batch_sizes(sched) == [8]
