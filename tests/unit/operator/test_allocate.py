"""The allocation loop's actuator: what one step writes, in which order, for a move, for
unknown pressure and after a conflict (against an in-memory Kube; the e2e tests run it for real)."""
from __future__ import annotations

import pytest

from laps_agent.policy.allocation import AllocationConfig, Decision, Move, PolicyState
from laps_operator import metrics
from laps_operator.allocation.pressure import Reading, unknown
from laps_operator.allocation.tick import (
    OFF_RECHECK_S,
    PRESSURE_UNAVAILABLE,
    AllocationLoop,
    allocation_status,
    config_of,
    state_from_status,
    state_to_status,
    step,
)
from laps_operator.naming import GROUP_LABEL
from laps_operator.reconcile import cycle
from laps_operator.reconcile.kube import KubeError, Ref
from laps_operator.reconcile.writers import cr_ref
from laps_operator.spec.cluster import parse_spec
from laps_operator.status.conditions import condition
from tests.unit.operator.fake_kube import FakeKube, cluster, prefill_pod

NOW = 1_800_000_000.0
GROUPS = {"short": ["c-prefill-0", "c-prefill-1"], "long": ["c-prefill-2", "c-prefill-3"]}
LONG_HEAVY = Reading({"short": 0.0, "long": 4.0})   # seconds of prefill work per second


def make_kube(status: dict | None = None, **cluster_kw) -> FakeKube:
    kube = FakeKube()
    kube.add(cluster(status={"groups": GROUPS, "groupSizes": {"short": 2, "long": 2}, **(status or {})}, **cluster_kw))
    for group, pods in GROUPS.items():
        for pod in pods:
            kube.add(prefill_pod(pod, group))
    return kube


def live_status(kube: FakeKube) -> dict:
    return kube.objects[("LAPSCluster", "ns", "c")]["status"]


def labels(kube: FakeKube) -> dict[str, str]:
    return {name: obj["metadata"]["labels"]["laps.io/prefill-group"]
            for (kind, _, name), obj in kube.objects.items() if kind == "Pod"}


def test_a_move_records_status_first_then_relabels_the_pod():
    kube = make_kube()
    outcome = step(kube, "ns", "c", LONG_HEAVY, NOW)

    assert outcome.move == Move("c-prefill-1", "short", "long")  # equal in-flight: the highest ordinal
    (status_write, label_write) = kube.writes
    assert status_write[0] == "patch/status" and label_write[0] == "patch"
    # Conditional on the version it read, so a concurrent writer's change is never overwritten.
    assert status_write[2]["metadata"]["resourceVersion"]
    assert label_write[1].name == "c-prefill-1"
    assert label_write[2] == {"metadata": {"labels": {"laps.io/prefill-group": "long"}}}

    status = live_status(kube)
    assert status["groups"] == {"short": ["c-prefill-0"], "long": ["c-prefill-1", "c-prefill-2", "c-prefill-3"]}
    assert status["groupSizes"] == {"short": 1, "long": 3}
    assert status["pressure"] == {"short": 0.0, "long": 4.0, "perPod": {"short": 0.0, "long": 2.0},
                                  "source": "prometheus"}
    assert status["lastRebalanceTime"] == "2027-01-15T08:00:00Z"
    [entry] = status["allocation"]["history"]
    assert (entry["pod"], entry["from"], entry["to"], entry["time"]) == ("c-prefill-1", "short", "long",
                                                                         "2027-01-15T08:00:00Z")
    assert "long per pod 2.00" in entry["reason"]
    # (merge patch: the null `wanted` removes the key)
    assert status["allocation"]["policy"] == {"streak": 0, "lastDirection": "short_to_long",
                                              "movedAt": {"c-prefill-1": NOW}}
    assert condition(status["conditions"], PRESSURE_UNAVAILABLE)["status"] == "False"
    assert labels(kube)["c-prefill-1"] == "long"


def test_unknown_pressure_moves_nothing_and_says_why_until_it_returns():
    kube = make_kube()
    down = unknown("PrometheusUnreachable", "cannot query http://prom:9090: ConnectError")
    outcome = step(kube, "ns", "c", down, NOW)
    assert outcome.move is None and outcome.became_unavailable
    assert [w[0] for w in kube.writes] == ["patch/status"]   # no label touched
    status = live_status(kube)
    cond = condition(status["conditions"], PRESSURE_UNAVAILABLE)
    assert (cond["status"], cond["reason"]) == ("True", "PrometheusUnreachable")
    assert "ConnectError" in cond["message"]
    assert "short" not in status["pressure"] and "long" not in status["pressure"]
    assert status["allocation"]["lastDecision"].startswith("pressure unknown: cannot query")

    # Still down: nothing new to write.
    again = step(kube, "ns", "c", down, NOW + 1)
    assert not again.became_unavailable and len(kube.writes) == 1

    back = step(kube, "ns", "c", Reading({"short": 0.0, "long": 0.0}), NOW + 2)
    assert back.recovered and back.move is None
    cond = condition(live_status(kube)["conditions"], PRESSURE_UNAVAILABLE)
    assert (cond["status"], cond["reason"]) == ("False", "Recovered")
    assert live_status(kube)["allocation"]["lastDecision"] == "no group is under pressure"


def test_a_conflicting_write_is_recomputed_from_the_live_object():
    kube = make_kube()
    kube.fail_next.append(KubeError(409, "the object has been modified"))
    outcome = step(kube, "ns", "c", LONG_HEAVY, NOW)
    assert outcome.move is not None
    assert [w[0] for w in kube.writes] == ["patch/status", "patch"]  # once each, after the retry
    assert len(live_status(kube)["allocation"]["history"]) == 1


def test_the_cooldown_survives_a_restart_through_status():
    # A previous operator moved c-prefill-1 ten seconds ago; the cooldown is 60 s.
    recorded = {"allocation": {"policy": {"lastDirection": "long_to_short", "movedAt": {"c-prefill-1": NOW - 10}}}}
    kube = make_kube(status=recorded, allocation={"cooldownSeconds": 60, "ratio": 1.5})
    outcome = step(kube, "ns", "c", LONG_HEAVY, NOW)
    assert outcome.move == Move("c-prefill-0", "short", "long")


def test_allocation_off_writes_nothing():
    kube = make_kube(allocation={"enabled": False})
    assert step(kube, "ns", "c", LONG_HEAVY, NOW).move is None
    assert kube.writes == []


def test_history_keeps_the_last_ten_moves():
    old = {"allocation": {"history": [{"pod": f"p-{i}"} for i in range(10)]}}
    decision = Decision(Move("c-prefill-1", "short", "long"), "why", PolicyState(), {"short": 0.0, "long": 1.0})
    status = allocation_status(old, GROUPS, LONG_HEAVY, decision, NOW)
    history = status["allocation"]["history"]
    assert len(history) == 10 and history[0]["pod"] == "p-1" and history[-1]["pod"] == "c-prefill-1"


def test_policy_state_round_trips_through_status():
    state = PolicyState("long_to_short", 1, {"c-prefill-3": NOW}, "short_to_long")
    assert state_from_status({"allocation": {"policy": state_to_status(state)}}) == state
    assert state_from_status({}) == PolicyState()


def test_spec_knobs_reach_the_policy_and_the_rest_keep_their_defaults():
    spec = parse_spec({"model": {"name": "m", "path": "/m"}, "prefill": {"replicas": 4}, "laps": {"allocation": {
        "enabled": True, "ratio": 3, "minPerGroup": 2, "cooldownSeconds": 5, "confirmIntervals": 4}}})
    config = config_of(spec)
    assert (config.ratio, config.min_per_group, config.pod_cooldown_s, config.confirm) == (3.0, 2, 5.0, 4)
    assert (config.min_pressure, config.min_improvement) == (AllocationConfig.min_pressure, 0.1)


@pytest.mark.parametrize("replicas", [1])
def test_a_single_pod_pool_has_no_loop(replicas):
    kube = make_kube(replicas=replicas, allocation={"enabled": False})
    assert step(kube, "ns", "c", LONG_HEAVY, NOW).reason == "allocation is off"


def test_the_loop_follows_an_interval_change_at_its_next_tick():
    kube = make_kube(allocation={"intervalSeconds": 60})
    spec = kube.objects[("LAPSCluster", "ns", "c")]["spec"]
    spec["monitoring"] = {"prometheusURL": "http://127.0.0.1:9"}   # nothing listens: pressure unknown
    clock = [1000.0]
    loop = AllocationLoop(kube, "ns", "c", "uid-1", clock=lambda: clock[0], wall=lambda: NOW)
    assert loop.tick() == (60.0, None)           # the first decision one interval after the start
    spec["laps"]["allocation"]["intervalSeconds"] = 2   # the user shortens it (a watch event wakes the loop)
    clock[0] += 2
    delay, outcome = loop.tick()
    assert delay == 2.0 and outcome is not None and outcome.reading.reason == "PrometheusUnreachable"
    spec["laps"]["allocation"]["enabled"] = False
    assert loop.tick() == (OFF_RECHECK_S, None)
    # Turned off: a PressureUnavailable left behind no longer says anything.
    cond = condition(live_status(kube)["conditions"], PRESSURE_UNAVAILABLE)
    assert (cond["status"], cond["reason"]) == ("False", "AllocationOff")
    del kube.objects[("LAPSCluster", "ns", "c")]
    assert loop.tick() == (None, None)            # gone: the loop ends


def test_decisions_slower_than_two_intervals_still_confirm_a_move(monkeypatch):
    """A Prometheus answering in 5 s with a 2 s interval: each decision starts as soon as the
    last ended. Counted from the start of the last decision, every one looked like a missed
    interval, the streak never passed 1 of 2 and no move was ever made."""
    kube = make_kube(allocation={"intervalSeconds": 2, "confirmIntervals": 2})
    kube.objects[("LAPSCluster", "ns", "c")]["spec"]["monitoring"] = {"prometheusURL": "http://prometheus:9090"}
    clock = [1000.0]

    def slow_prometheus(url, query, now, max_age_s):
        clock[0] += 5.0
        return LONG_HEAVY

    monkeypatch.setattr("laps_operator.allocation.tick.pressure.query_prometheus", slow_prometheus)
    loop = AllocationLoop(kube, "ns", "c", "uid-1", clock=lambda: clock[0], wall=lambda: NOW)
    moves = []
    for _ in range(4):
        delay, outcome = loop.tick()
        clock[0] += delay
        moves += [outcome.move] if outcome is not None and outcome.move else []
    assert moves[:1] == [Move("c-prefill-1", "short", "long")]


def test_turned_off_the_loop_clears_what_it_last_read_and_wanted(cluster_metrics):
    """Off after it ran with pressure known: `kubectl get laps -o wide` had gone on showing the
    last pressure, lastDecision the last decision, the gauge the last value, and a move wanted
    once (1/2) was made on the first interval after the loop came back on, hours later."""
    kube = make_kube(allocation={"confirmIntervals": 2})
    step(kube, "ns", "c", LONG_HEAVY, NOW)   # wanted 1/2: no move yet
    assert live_status(kube)["allocation"]["policy"]["streak"] == 1
    assert metrics.PRESSURE.labels(cluster="ns/c", group="long")._value.get() == 4.0
    spec = kube.objects[("LAPSCluster", "ns", "c")]["spec"]
    spec["laps"]["allocation"]["enabled"] = False
    loop = AllocationLoop(kube, "ns", "c", "uid-1", wall=lambda: NOW + 5)
    assert loop.tick() == (OFF_RECHECK_S, None)

    status = live_status(kube)
    assert "pressure" not in status
    assert status["allocation"]["lastDecision"] == "allocation is off"
    assert status["allocation"]["policy"]["streak"] == 0 and "wanted" not in status["allocation"]["policy"]
    cond = condition(status["conditions"], PRESSURE_UNAVAILABLE)
    assert (cond["status"], cond["reason"]) == ("False", "AllocationOff")
    assert ("ns/c", "long") not in {(s.labels["cluster"], s.labels["group"])
                                    for m in metrics.PRESSURE.collect() for s in m.samples}
    writes = len(kube.writes)
    assert loop.tick() == (OFF_RECHECK_S, None)
    assert len(kube.writes) == writes   # said once

    # Back on: the move needs its two intervals in a row again.
    spec["laps"]["allocation"]["enabled"] = True
    assert step(kube, "ns", "c", LONG_HEAVY, NOW + 3600).move is None
    # ...and the condition says the pressure is known, no longer that the loop is off (it did
    # until pressure was once lost and came back).
    cond = condition(live_status(kube)["conditions"], PRESSURE_UNAVAILABLE)
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "PressureKnown", "pressure is known")
    assert step(kube, "ns", "c", LONG_HEAVY, NOW + 3601).move is not None


def test_only_pods_that_serve_are_counted_and_moved():
    """A pod not Ready (crash-looping, loading its model, being rolled) gets no work from the
    gateways. The step counted and moved such pods: a group's only Ready pod could be moved
    away, leaving its class unserved, and a pod that serves nothing was moved as the interval's
    one move, relieving nothing."""
    kube = make_kube()
    kube.add(prefill_pod("c-prefill-1", "short", ready=False))   # short: 0 serves, 1 does not
    outcome = step(kube, "ns", "c", LONG_HEAVY, NOW)
    assert outcome.move is None and "short is at its minimum of 1 pods" in outcome.reason
    assert set(labels(kube).items()) == {(p, g) for g, ps in GROUPS.items() for p in ps}
    # Per-pod pressure counts the Ready pods alone: long's 4 over its 2 Ready pods, then 1.
    assert live_status(kube)["pressure"]["perPod"] == {"short": 0.0, "long": 2.0}
    kube.add(prefill_pod("c-prefill-2", "long", ready=False))
    step(kube, "ns", "c", LONG_HEAVY, NOW + 1)
    assert live_status(kube)["pressure"]["perPod"]["long"] == 4.0
    # With three short pods of which the highest is not Ready, a Ready one moves.
    kube = make_kube(status={"groups": {"short": ["c-prefill-0", "c-prefill-1", "c-prefill-4"], "long": GROUPS["long"]},
                             "groupSizes": {"short": 3, "long": 2}}, replicas=5)
    kube.add(prefill_pod("c-prefill-4", "short", ready=False))
    assert step(kube, "ns", "c", LONG_HEAVY, NOW).move == Move("c-prefill-1", "short", "long")
    # A group with no Ready pod: nothing moves, and the decision says why.
    kube = make_kube()
    for pod in GROUPS["long"]:
        kube.add(prefill_pod(pod, "long", ready=False))
    assert step(kube, "ns", "c", LONG_HEAVY, NOW).reason == "a group has no pod that serves"


def test_a_pod_deleted_before_its_relabel_keeps_the_move():
    """The pod went (its StatefulSet makes it again) between the list and the label patch: the
    404 failed the step after status had recorded the move, so the Event and metrics were lost
    and the write counted as failing. The recorded move gives the new pod its group."""
    kube = make_kube()
    kube.refuse = lambda verb, ref, body, dry: KubeError(404, f"Pod {ref.name} not found") if ref.kind == "Pod" else None
    outcome = step(kube, "ns", "c", LONG_HEAVY, NOW)
    assert outcome.move == Move("c-prefill-1", "short", "long")
    assert live_status(kube)["groups"]["long"] == ["c-prefill-1", "c-prefill-2", "c-prefill-3"]


def test_a_loop_that_never_ran_writes_nothing_when_off():
    kube = make_kube(allocation={"enabled": False})
    assert AllocationLoop(kube, "ns", "c", "uid-1").tick() == (OFF_RECHECK_S, None)
    assert kube.writes == []


def test_a_spec_the_api_server_refused_moves_nothing_the_children_run_the_one_before():
    """Generation 2 was refused (a child's dry run): its allocation settings are not in force,
    so neither the step nor the loop acts on them until the cluster's reconcile applies it."""
    refused = {"phase": "Invalid", "observedGeneration": 2,
               "conditions": [{"type": "InvalidSpec", "status": "True", "reason": "ChildRefused", "message": "no"}]}
    kube = make_kube(status=refused)
    kube.objects[("LAPSCluster", "ns", "c")]["metadata"]["generation"] = 2
    outcome = step(kube, "ns", "c", LONG_HEAVY, NOW)
    assert outcome.move is None and outcome.reason == "invalid spec"
    assert kube.writes == [] and set(labels(kube).values()) == {"short", "long"}
    assert AllocationLoop(kube, "ns", "c", "uid-1", clock=lambda: 0.0, wall=lambda: NOW).tick() == (OFF_RECHECK_S, None)


def test_a_pod_event_on_a_refused_spec_gives_a_recreated_pod_its_recorded_group_and_plans_nothing():
    """Generation 2 (prefill.replicas 4 -> 2) was refused: the StatefulSet still runs 4 pods. A
    pod event must not plan groups for 2 pods; a recreated pod gets back its recorded group."""
    from laps_operator.reconcile.cycle import sync_groups_of

    refused = {"phase": "Invalid", "observedGeneration": 2,
               "conditions": [{"type": "InvalidSpec", "status": "True", "reason": "ChildRefused", "message": "no"}]}
    kube = make_kube(status=refused, replicas=2)
    kube.objects[("LAPSCluster", "ns", "c")]["metadata"]["generation"] = 2
    kube.add(prefill_pod("c-prefill-3", None))   # recreated by its StatefulSet, no group label yet
    assert sync_groups_of(kube, "ns", "c") is None
    assert labels(kube) == {"c-prefill-0": "short", "c-prefill-1": "short", "c-prefill-2": "long", "c-prefill-3": "long"}
    assert live_status(kube)["groups"] == GROUPS


def counting(kube: FakeKube) -> dict[str, int]:
    """Counts of the cluster's GETs and the pod LISTs `kube` serves from now on."""
    counts = {"get": 0, "list": 0}
    get, list_ = kube.get, kube.list

    def counted_get(ref):
        counts["get"] += ref.kind == "LAPSCluster"
        return get(ref)

    def counted_list(ref, *args, **kwargs):
        counts["list"] += ref.kind == "Pod"
        return list_(ref, *args, **kwargs)

    kube.get, kube.list = counted_get, counted_list
    return counts


def prometheus_loop(kube: FakeKube, monkeypatch, meanwhile=lambda: None) -> tuple[AllocationLoop, list[float]]:
    """A loop on a Prometheus answering LONG_HEAVY (after `meanwhile()`), its first tick done."""
    kube.objects[("LAPSCluster", "ns", "c")]["spec"]["monitoring"] = {"prometheusURL": "http://prometheus:9090"}

    def prometheus(url, query, now, max_age_s):
        meanwhile()
        return LONG_HEAVY

    monkeypatch.setattr("laps_operator.allocation.tick.pressure.query_prometheus", prometheus)
    clock = [1000.0]
    loop = AllocationLoop(kube, "ns", "c", "uid-1", clock=lambda: clock[0], wall=lambda: NOW)
    assert loop.tick() == (1.0, None)   # the first decision one interval after the start
    clock[0] += 1.0
    return loop, clock


def test_a_due_tick_reads_the_cluster_parses_its_spec_and_lists_its_pods_once(monkeypatch):
    kube = make_kube()
    loop, _ = prometheus_loop(kube, monkeypatch)
    counts = counting(kube)
    parses = []
    parse = cycle.parse_cluster
    monkeypatch.setattr(cycle, "parse_cluster", lambda body: parses.append(1) or parse(body))
    delay, outcome = loop.tick()
    assert outcome.move == Move("c-prefill-1", "short", "long")
    assert (counts, len(parses)) == ({"get": 1, "list": 1}, 1)
    assert [w[0] for w in kube.writes] == ["patch/status", "patch"]


def test_a_move_the_other_operator_made_during_the_pressure_read_is_never_undone(monkeypatch):
    """The tick reads the cluster before the pressure, the pods after it: a move another operator
    process recorded and labelled in between shows in the pods but not in the recording read.
    Planned from that recording, the group sync would have labelled the pod back; the step finds
    the cluster changed since its read and decides again on a fresh one."""
    kube = make_kube()
    moved = {"short": ["c-prefill-0"], "long": ["c-prefill-1", "c-prefill-2", "c-prefill-3"]}

    def other_operator_moves_a_pod():
        if labels(kube)["c-prefill-1"] == "short":
            kube.patch(cr_ref("ns", "c"), {"status": {"groups": moved, "groupSizes": {"short": 1, "long": 3}}},
                       subresource="status")
            kube.patch(Ref("v1", "Pod", "ns", "c-prefill-1"), {"metadata": {"labels": {GROUP_LABEL: "long"}}})

    loop, _ = prometheus_loop(kube, monkeypatch, other_operator_moves_a_pod)
    writes = len(kube.writes)
    delay, outcome = loop.tick()
    assert outcome.move is None and "short is at its minimum of 1 pods" in outcome.reason
    pod_writes = [w for w in kube.writes[writes:] if w[1].kind == "Pod"]
    assert pod_writes == [("patch", Ref("v1", "Pod", "ns", "c-prefill-1"),
                           {"metadata": {"labels": {GROUP_LABEL: "long"}}})]   # the other's, alone
    assert labels(kube)["c-prefill-1"] == "long" and live_status(kube)["groups"] == moved


def test_a_cluster_changed_during_the_pressure_read_is_decided_on_afresh(monkeypatch):
    kube = make_kube()

    def someone_annotates_it():
        kube.patch(cr_ref("ns", "c"), {"metadata": {"annotations": {"note": "edited"}}})

    loop, _ = prometheus_loop(kube, monkeypatch, someone_annotates_it)
    delay, outcome = loop.tick()
    assert outcome.move == Move("c-prefill-1", "short", "long")
    live = kube.objects[("LAPSCluster", "ns", "c")]
    assert live["metadata"]["annotations"] == {"note": "edited"} and len(live["status"]["allocation"]["history"]) == 1


def test_a_cluster_deleted_during_the_pressure_read_gets_no_write_and_no_error(monkeypatch):
    kube = make_kube()

    def someone_deletes_it():
        kube.objects.pop(("LAPSCluster", "ns", "c"), None)

    loop, _ = prometheus_loop(kube, monkeypatch, someone_deletes_it)
    writes = len(kube.writes)
    delay, outcome = loop.tick()
    assert outcome is not None and outcome.cluster is None and outcome.move is None
    assert kube.writes[writes:] == []
