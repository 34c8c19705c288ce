"""The ejection cap: passive health never takes a pool's last healthy pod, nor more than its
max-ejection share, out of routing; the load tracker applies it per pool."""
from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from laps_agent.gateway.config import ProxyConfig
from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.proxy.load import LoadTracker
from laps_agent.policy.outlier import ejection_cap, may_eject


def test_a_pool_of_one_never_loses_its_pod():
    assert not may_eject(pool_size=1, ejected=0, max_percent=100)


def test_of_two_pods_one_may_go_but_not_both():
    assert may_eject(2, 0, 50) and not may_eject(2, 1, 50)


def test_at_least_one_pod_may_go_from_a_pool_of_two_or_more_whatever_the_percent():
    assert ejection_cap(4, 10) == 1
    assert ejection_cap(10, 50) == 5


def test_zero_percent_turns_ejection_off():
    assert ejection_cap(10, 0) == 0


@given(size=st.integers(0, 50), percent=st.integers(0, 100))
def test_never_the_last_healthy_pod_and_never_over_the_share(size, percent):
    cap = ejection_cap(size, percent)
    assert cap <= max(size - 1, 0)
    assert cap <= max(1, size * percent // 100)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _tracker(**config) -> tuple[LoadTracker, GatewayMetrics, _Clock]:
    metrics, clock = GatewayMetrics(), _Clock()
    config.setdefault("eject_after_failures", 1)
    return LoadTracker(metrics, ProxyConfig(**config), clock=clock), metrics, clock


def _ejections(metrics: GatewayMetrics, pool: str, outcome: str) -> float:
    return metrics.registry.get_sample_value("laps_gateway_ejections_total",
                                             {"pool": pool, "outcome": outcome})


def _healthy(tracker: LoadTracker, names) -> list[str]:
    loads = tracker.loads()
    return [n for n in names if n not in loads or loads[n].healthy]


def test_every_pod_of_a_group_failing_leaves_one_routable():
    tracker, metrics, _ = _tracker()
    pool = ["a", "b", "c"]
    for _ in range(5):
        for name in pool:
            tracker.record_failure(name, "long", pool)
    assert len(_healthy(tracker, pool)) == 2  # 50% of 3 pods: one ejected at a time
    assert _ejections(metrics, "long", "ejected") == 1
    assert _ejections(metrics, "long", "capped") > 0


def test_the_only_decode_pod_is_never_ejected():
    tracker, _, _ = _tracker(max_ejection_percent=100)
    for _ in range(10):
        assert not tracker.record_failure("d0", "decode", ["d0"])
    assert _healthy(tracker, ["d0"]) == ["d0"]


def test_an_ejection_that_ran_out_frees_the_pool_s_share():
    tracker, _, clock = _tracker(eject_seconds=10)
    assert tracker.record_failure("a", "short", ["a", "b"])
    assert not tracker.record_failure("b", "short", ["a", "b"])  # a is out: b is the last
    clock.now = 11
    assert tracker.record_failure("b", "short", ["a", "b"])      # a is back: b may go now
    assert _healthy(tracker, ["a", "b"]) == ["a"]


def test_failures_below_the_threshold_eject_nothing_and_a_success_resets_them():
    tracker, _, _ = _tracker(eject_after_failures=3)
    pool = ["a", "b"]
    for _ in range(2):
        tracker.record_failure("a", "short", pool)
    tracker.record_success("a")
    for _ in range(2):
        assert not tracker.record_failure("a", "short", pool)
    assert tracker.record_failure("a", "short", pool)


def test_an_ejection_is_a_warning_naming_the_pod_once(caplog):
    """Requests refused for want of a pod are debug lines (proxy.py): the ejection that took
    the pod out is what the log must show, once."""
    tracker, _, _ = _tracker(eject_after_failures=2, eject_seconds=30)
    pool = ["a", "b"]
    with caplog.at_level(logging.WARNING, logger="laps_agent.gateway"):
        for _ in range(4):
            tracker.record_failure("a", "decode", pool)
    assert [r.getMessage() for r in caplog.records] == [
        "decode pod a is out of routing for 30 s after 2 failures in a row"]
