"""The WritesFailing condition and the per-cluster loop threads (no server: an in-memory Kube)."""
from __future__ import annotations

import threading
import time

import pytest

from laps_operator.reconcile import writers
from laps_operator.reconcile.kube import KubeError
from laps_operator.reconcile.workers import ClusterLoops, Ticker
from laps_operator.status.conditions import condition
from tests.unit.operator.fake_kube import FakeKube, cluster


def poll(probe, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.01)   # poll interval, bounded by the deadline
    raise AssertionError("condition not reached")


@pytest.fixture
def kube():
    kube = FakeKube()
    kube.add(cluster())
    yield kube
    writers.forget("ns", "c")


def writes_failing(kube: FakeKube) -> dict | None:
    return condition(kube.objects[("LAPSCluster", "ns", "c")]["status"].get("conditions"), writers.WRITES_FAILING)


def test_writes_failing_appears_after_consecutive_failures_and_clears_on_success(kube):
    error = KubeError(403, 'statefulsets.apps "c-prefill" is forbidden')
    for _ in range(writers.FAILURES_BEFORE_CONDITION - 1):
        assert not writers.record_failure(kube, "ns", "c", error)
    assert writes_failing(kube) is None          # a blip or two says nothing yet
    assert writers.record_failure(kube, "ns", "c", error)
    cond = writes_failing(kube)
    assert (cond["status"], cond["reason"]) == ("True", "WriteFailures")
    assert "forbidden" in cond["message"] and "3 consecutive" in cond["message"]
    assert not writers.record_failure(kube, "ns", "c", error)   # said once, not rewritten

    assert writers.record_success(kube, "ns", "c")
    cond = writes_failing(kube)
    assert (cond["status"], cond["reason"]) == ("False", "Recovered")
    assert not writers.record_success(kube, "ns", "c")


def test_a_condition_left_by_a_previous_operator_is_cleared_by_the_first_success(kube):
    for _ in range(writers.FAILURES_BEFORE_CONDITION):
        writers.record_failure(kube, "ns", "c", KubeError(500, "etcd timeout"))
    writers.forget("ns", "c")                    # as a restarted operator: nothing remembered
    assert writers.record_success(kube, "ns", "c")
    assert writes_failing(kube)["status"] == "False"


def test_conflicts_are_retried_other_errors_are_not():
    calls = []

    def conflict_twice():
        calls.append(1)
        if len(calls) < 3:
            raise KubeError(409, "modified")
        return "done"

    assert writers.retry_on_conflict(conflict_twice) == "done" and len(calls) == 3
    with pytest.raises(KubeError):
        writers.retry_on_conflict(lambda: (_ for _ in ()).throw(KubeError(422, "invalid")))


def test_one_writer_at_a_time_per_cluster_and_reentrant():
    lock = writers.cluster_lock("ns", "x")
    assert lock is writers.cluster_lock("ns", "x") and lock is not writers.cluster_lock("ns", "y")
    with lock, lock:   # the reconcile holds it around the group sync, which takes it again
        acquired = []
        other = threading.Thread(target=lambda: acquired.append(lock.acquire(timeout=0.05)))
        other.start()
        other.join()
        assert acquired == [False]   # another writer of the same cluster waits
    writers.forget("ns", "x")
    writers.forget("ns", "y")


def test_a_ticker_runs_when_due_wakes_early_and_survives_a_failing_run():
    runs: list[int] = []

    def fn():
        runs.append(len(runs))
        if len(runs) == 2:
            raise RuntimeError("one bad run")
        return 3600.0                  # next run only when woken

    ticker = Ticker("test", fn, first_delay=0.0).start()
    poll(lambda: len(runs) == 1)
    ticker.wake()
    poll(lambda: len(runs) == 2)       # it raised: the loop goes on after ERROR_DELAY_S...
    ticker.wake()
    poll(lambda: len(runs) == 3)       # ...or sooner when woken
    ticker.stop()
    ticker.thread.join(5)
    assert not ticker.thread.is_alive()


def test_cluster_loops_start_once_per_uid_and_stop():
    loops = ClusterLoops()
    made: list[str] = []

    def make(uid):
        def factory():
            made.append(uid)
            return {"resync": Ticker("t", lambda: 3600.0, 3600.0)}
        return factory

    assert loops.ensure("ns", "c", "u1", make("u1"))
    assert not loops.ensure("ns", "c", "u1", make("u1"))   # every watch event: no new thread
    assert loops.ensure("ns", "c", "u2", make("u2"))       # deleted and created again
    assert made == ["u1", "u2"] and loops.running() == [("ns", "c")]
    # The old cluster's deletion, handled late (a retried delete handler), leaves the new one's loops.
    loops.stop("ns", "c", "u1")
    assert loops.running() == [("ns", "c")] and loops.current("ns", "c", "u2") and not loops.current("ns", "c", "u1")
    loops.stop("ns", "c", "u2")
    assert loops.running() == []
    loops.stop_all()


def test_a_ticker_whose_function_says_none_stops():
    ticker = Ticker("gone", lambda: None, first_delay=0.0).start()
    ticker.thread.join(5)
    assert ticker.stopped and not ticker.thread.is_alive()


def test_a_ticker_asked_to_wait_longer_than_threads_can_wait_lives_on():
    """An allocation interval of 1e10 s (a typo; the CRD now stops at 3600) made the loop's
    Event.wait raise OverflowError: its thread ended, and only an operator restart brought the
    allocation loop back."""
    runs: list[int] = []

    def fn():
        runs.append(len(runs))
        return 1e10

    ticker = Ticker("long", fn, first_delay=0.0).start()
    poll(lambda: len(runs) == 1)
    ticker.wake()
    poll(lambda: len(runs) == 2)       # still there, and still answering a wake
    assert ticker.thread.is_alive()
    ticker.stop()
    ticker.thread.join(5)
