"""Example-based tests that read like the scheduling behaviour a user sees."""
from __future__ import annotations

import pytest

from laps_agent.policy.scheduling import PrefillItem, PrefillScheduler, SchedulerConfig


def rids(decision):
    return [item.rid for item in decision.batch]


def test_a_long_request_arriving_with_eight_short_ones_runs_after_them():
    sched = PrefillScheduler(SchedulerConfig(length_threshold=256, max_batch_size=8))
    sched.add(PrefillItem("long", 2048), now=0.0)
    for i in range(8):
        sched.add(PrefillItem(f"s{i}", 40), now=0.0)
    first = sched.next_batch(0.0)
    assert first.queue == "short" and rids(first) == [f"s{i}" for i in range(8)]
    second = sched.next_batch(0.1)
    assert second.queue == "long" and rids(second) == ["long"]


def test_fifo_mode_serves_in_arrival_order_whatever_the_length():
    sched = PrefillScheduler(SchedulerConfig(enabled=False, max_batch_size=2))
    for rid, tokens in [("a", 2000), ("b", 10), ("c", 900), ("d", 5)]:
        sched.add(PrefillItem(rid, tokens), now=0.0)
    order = []
    while len(sched):
        decision = sched.next_batch(1.0)
        assert decision.queue == "fifo"
        order += rids(decision)
    assert order == ["a", "b", "c", "d"]


def test_classification_counts_only_uncached_tokens():
    sched = PrefillScheduler(SchedulerConfig(length_threshold=256))
    assert sched.add(PrefillItem("mostly-cached", prompt_tokens=3000, cached_tokens=2900), 0.0) == "short"
    assert sched.add(PrefillItem("fresh", prompt_tokens=300), 0.0) == "long"
    assert sched.add(PrefillItem("all-cached", prompt_tokens=100, cached_tokens=100), 0.0) == "short"
    assert sched.pending() == {"short": (2, 101), "long": (1, 300)}


def test_a_request_bigger_than_the_token_budget_still_runs_alone():
    sched = PrefillScheduler(SchedulerConfig(max_prefill_tokens=1000))
    sched.add(PrefillItem("huge", 5000), 0.0)
    sched.add(PrefillItem("next", 2000), 0.0)
    assert rids(sched.next_batch(0.0)) == ["huge"]
    assert rids(sched.next_batch(0.0)) == ["next"]
    assert len(sched) == 0


def test_long_batches_stop_at_the_long_budget_so_a_short_arriving_behind_waits_for_less():
    # Three 1,500-token longs: one batch of 4,500 tokens within max_prefill_tokens, but a short
    # that arrives while it runs would wait for all of it; capped at 3,000 tokens, two batches,
    # and the short goes between them.
    sched = PrefillScheduler(SchedulerConfig(max_prefill_tokens=8192, max_long_batch_tokens=3000))
    for i in range(3):
        sched.add(PrefillItem(f"L{i}", 1500), now=0.0)
    assert rids(sched.next_batch(0.0)) == ["L0", "L1"]
    sched.add(PrefillItem("s", 40), now=0.1)
    assert rids(sched.next_batch(0.2)) == ["s"]
    assert rids(sched.next_batch(0.3)) == ["L2"]
    # Short batches keep the whole budget; FIFO (LAPS off) knows no classes.
    short = PrefillScheduler(SchedulerConfig(max_prefill_tokens=8192, max_long_batch_tokens=100, wait_window_ms=0))
    for i in range(4):
        short.add(PrefillItem(f"s{i}", 200), now=0.0)
    assert len(rids(short.next_batch(0.0))) == 4
    fifo = PrefillScheduler(SchedulerConfig(enabled=False, max_long_batch_tokens=1000))
    for i in range(3):
        fifo.add(PrefillItem(f"L{i}", 1500), now=0.0)
    assert rids(fifo.next_batch(0.0)) == ["L0", "L1", "L2"]


def test_a_negative_long_budget_is_refused_and_zero_is_the_whole_batch_budget():
    with pytest.raises(ValueError, match="max_long_batch_tokens must be >= 0"):
        SchedulerConfig(max_long_batch_tokens=-1)
    whole = PrefillScheduler(SchedulerConfig(max_prefill_tokens=8192, max_long_batch_tokens=0))
    for i in range(3):
        whole.add(PrefillItem(f"L{i}", 1500), now=0.0)
    assert rids(whole.next_batch(0.0)) == ["L0", "L1", "L2"]


def shorts_arriving_every(sched: PrefillScheduler, gap_s: float, until: float) -> None:
    """The scheduler has seen short requests arrive every `gap_s` seconds up to `until` (a
    stream it expects to go on: its window then holds)."""
    for k in range(20, 0, -1):
        sched.window.note_short_arrival(until - k * gap_s, 20)


def test_short_requests_wait_for_the_window_then_go_together():
    sched = PrefillScheduler(SchedulerConfig(wait_window_ms=10, wait_max_batch=4))
    shorts_arriving_every(sched, 0.003, 1.000)
    sched.add(PrefillItem("a", 20), 1.000)
    held = sched.next_batch(1.001)
    assert held.batch == [] and held.wake_at == pytest.approx(1.010) and held.reason == "window_hold"
    sched.add(PrefillItem("b", 20), 1.004)
    assert sched.next_batch(1.005).batch == []
    released = sched.next_batch(held.wake_at)
    assert rids(released) == ["a", "b"] and released.reason == "short_window_expired"


def test_a_lone_short_request_goes_at_once_when_no_other_is_expected_within_the_window():
    """The window merges arrivals; where none is expected before it ends (an idle pod at low
    load), holding would only delay the one request it holds."""
    sched = PrefillScheduler(SchedulerConfig(wait_window_ms=10, wait_max_batch=4))
    sched.add(PrefillItem("first", 20), 0.0)          # no arrival seen before: none expected
    decision = sched.next_batch(0.0)
    assert rids(decision) == ["first"] and decision.reason == "short_none_expected"
    sched.add(PrefillItem("later", 20), 5.0)          # seconds apart: still none expected
    decision = sched.next_batch(5.0)
    assert rids(decision) == ["later"] and decision.reason == "short_none_expected"
    shorts_arriving_every(sched, 0.002, 9.0)          # a stream: now the window holds
    sched.add(PrefillItem("busy", 20), 9.0)
    assert sched.next_batch(9.0).reason == "window_hold"


def test_reaching_the_target_depth_dispatches_before_the_window_ends():
    sched = PrefillScheduler(SchedulerConfig(wait_window_ms=50, wait_max_batch=3))
    for i in range(3):
        sched.add(PrefillItem(f"s{i}", 20), 0.0)
    decision = sched.next_batch(0.001)
    assert rids(decision) == ["s0", "s1", "s2"] and decision.reason == "short_target_depth"


def test_a_long_request_that_fits_in_the_window_uses_the_idle_time():
    sched = PrefillScheduler(SchedulerConfig(wait_window_ms=50, wait_max_batch=8))
    # The engine has seen that 300 tokens take 10 ms and 30 take 1 ms.
    sched.observe_prefill([PrefillItem("x", 300)], 0.010)
    sched.observe_prefill([PrefillItem("y", 30)], 0.001)
    shorts_arriving_every(sched, 0.01, 0.0)
    sched.add(PrefillItem("short", 20), 0.0)
    sched.add(PrefillItem("long", 300), 0.0)
    decision = sched.next_batch(0.001)
    assert rids(decision) == ["long"] and decision.reason == "long_in_window"
    assert sched.next_batch(0.011).batch == []           # short still inside its window
    assert rids(sched.next_batch(0.050)) == ["short"]


def test_a_long_request_longer_than_the_window_does_not_block_the_held_shorts():
    sched = PrefillScheduler(SchedulerConfig(wait_window_ms=5, wait_max_batch=8))
    sched.observe_prefill([PrefillItem("x", 2048)], 4.7)   # CPU: a 2048-token prefill takes seconds
    sched.add(PrefillItem("short", 20), 0.0)
    sched.add(PrefillItem("long", 2048), 0.0)
    decision = sched.next_batch(0.001)
    assert rids(decision) == ["short"] and decision.reason == "short_window_cut_for_long"
    assert rids(sched.next_batch(0.05)) == ["long"]


def test_a_starved_long_request_goes_before_waiting_short_ones():
    sched = PrefillScheduler(SchedulerConfig(max_long_wait_ms=100, wait_window_ms=0))
    sched.add(PrefillItem("long", 2000), 0.0)
    t, step = 0.0, 0.03   # each short batch keeps the engine busy for 30 ms
    while True:
        sched.add(PrefillItem(f"s{t:.2f}", 20), t)   # a steady stream of short requests
        if "long" in rids(sched.next_batch(t)):
            break
        t += step
    # served at the first scheduling step after its 100 ms bound passed
    assert 0.1 <= t < 0.1 + step


def test_abort_removes_a_queued_request_and_only_once():
    sched = PrefillScheduler(SchedulerConfig(wait_window_ms=0))
    sched.add(PrefillItem("a", 20), 0.0)
    sched.add(PrefillItem("b", 20), 0.0)
    assert sched.abort("a") is True
    assert sched.abort("a") is False
    assert sched.abort("never-added") is False
    assert rids(sched.next_batch(0.0)) == ["b"]
    assert sched.abort("b") is False   # already dispatched


def test_bad_input_is_refused_with_a_message_and_loses_nothing():
    sched = PrefillScheduler(SchedulerConfig())
    sched.add(PrefillItem("a", 20), 0.0)
    with pytest.raises(ValueError, match="already queued"):
        sched.add(PrefillItem("a", 30), 0.0)
    with pytest.raises(ValueError, match="prompt_tokens must be >= 1"):
        sched.add(PrefillItem("b", 0), 0.0)
    assert len(sched) == 1 and sched.pending()["short"] == (1, 20)
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        SchedulerConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="wait_window_ms"):
        SchedulerConfig(wait_window_ms=float("nan"))


def test_requests_put_back_after_a_failed_start_go_first_and_keep_their_wait():
    sched = PrefillScheduler(SchedulerConfig(wait_window_ms=0, max_long_wait_ms=100, max_batch_size=2))
    sched.add(PrefillItem("old-long", 2000), 0.0)
    sched.add(PrefillItem("long-2", 2000), 0.0)
    batch = sched.next_batch(0.2).batch          # overdue: both long ones go
    assert [i.rid for i in batch] == ["old-long", "long-2"]
    sched.add(PrefillItem("short", 20), 0.2)
    sched.requeue(batch[1:], 0.2)                # the engine had KV pages for the first only
    # still overdue after being put back: it goes before the short request
    decision = sched.next_batch(0.21)
    assert rids(decision) == ["long-2"] and decision.reason == "long_starved"
    assert rids(sched.next_batch(0.21)) == ["short"]


def test_a_bad_requeue_changes_nothing():
    sched = PrefillScheduler(SchedulerConfig(wait_window_ms=0))
    sched.add(PrefillItem("a", 20), 0.0)
    sched.add(PrefillItem("b", 20), 0.0)
    batch = sched.next_batch(0.0).batch
    sched.add(PrefillItem("c", 20), 0.0)
    with pytest.raises(ValueError, match="'c' is already queued"):
        sched.requeue(batch + [PrefillItem("c", 20)], 0.0)
    assert len(sched) == 1
    sched.requeue(batch, 0.0)
    assert rids(sched.next_batch(0.0)) == ["a", "b", "c"]


def test_cheap_long_requests_go_first_when_that_costs_the_held_short_ones_least():
    sched = PrefillScheduler(SchedulerConfig(wait_window_ms=5, wait_max_batch=8))
    # launch-bound costs (GPU graphs): 10 ms per batch, 1 us per token
    sched.observe_prefill([PrefillItem("x", 40)], 0.010 + 40e-6)
    sched.observe_prefill([PrefillItem("y", 4000)], 0.010 + 4000e-6)
    sched.add(PrefillItem("short", 40), 0.0)
    for i in range(4):
        sched.add(PrefillItem(f"long{i}", 1000), 0.0)
    # 4 long requests spared a 10 ms wait outweigh one short request overrunning its window by ~10 ms
    decision = sched.next_batch(0.001)
    assert decision.reason == "long_in_window" and len(decision.batch) == 4
    assert rids(sched.next_batch(0.015)) == ["short"]
