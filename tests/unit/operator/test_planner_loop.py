"""The planner on Kubernetes (operator/laps_operator/planner/): what Prometheus' answers become,
which counts the pools run, and what one step writes (against an in-memory Kube; the e2e test
runs the real operator with a real Prometheus)."""
from __future__ import annotations

import math

import pytest

from laps_agent.policy.groups import DRAINING, PodView, plan_groups
from laps_agent.policy.planner import Pools
from laps_operator import metrics
from laps_operator.naming import ClusterRef
from laps_operator.planner import observe
from laps_operator.planner.tick import (
    FROZEN,
    PlannerLoop,
    config_of,
    drain_step,
    slo_of,
    state_from_status,
    state_to_status,
    step,
)
from laps_operator.reconcile.cycle import parse_cluster, short_need
from laps_operator.reconcile.kube import Ref
from laps_operator.reconcile.writers import cr_ref
from laps_operator.spec.cluster import parse_spec
from laps_operator.spec.replicas import replicas_in_force
from laps_operator.status.conditions import condition
from tests.unit.operator.fake_kube import FakeKube

NOW = 1_800_000_000.0
REF = ClusterRef("c", "ns", "uid-1")
AUTOSCALING = {"enabled": True, "intervalSeconds": 30, "gpuBudget": 8, "prefill": {"min": 1, "max": 6},
               "decode": {"min": 1, "max": 4}, "startupSeconds": 0, "scaleDownStabilizationSeconds": 0}


def spec(**autoscaling) -> dict:
    return {"model": {"name": "m", "path": "/m"}, "engine": {"device": "cuda"}, "prefill": {"replicas": 2},
            "decode": {"replicas": 1}, "monitoring": {"prometheusURL": "http://prometheus:9090"},
            "autoscaling": {**AUTOSCALING, **autoscaling}}


def lapscluster(status: dict | None = None, **autoscaling) -> dict:
    return {"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1", "generation": 1, "resourceVersion": "1"},
            "spec": spec(**autoscaling), "status": status or {}}


def answers(rate=(20.0, 6.0), cost=(0.017, 0.0001), decode=40.0) -> dict[str, observe.Samples]:
    return {"arrivals": [({"class": "short"}, rate[0]), ({"class": "long"}, rate[1])],
            "tokens": [({"class": "short", "kind": "prompt"}, rate[0] * 136),
                       ({"class": "short", "kind": "output"}, rate[0] * 150),
                       ({"class": "long", "kind": "prompt"}, rate[1] * 1800),
                       ({"class": "long", "kind": "output"}, rate[1] * 150)],
            "waiting": [({"group": "short"}, 1.0), ({"group": "long"}, 3.0)],
            "decode": [({}, decode)],
            "cost": [({"term": "overhead"}, cost[0]), ({"term": "per_token"}, cost[1])]}


def test_prometheus_answers_become_the_planners_observation_and_costs():
    reading = observe.observation(answers(), NOW)
    short, long_ = reading.observation.classes["short"], reading.observation.classes["long"]
    assert (short.rate, short.uncached_tokens, short.output_tokens, short.waiting) == (20.0, 136.0, 150.0, 1.0)
    assert (long_.rate, long_.uncached_tokens, long_.waiting) == (6.0, 1800.0, 3.0)
    assert reading.observation.decode_running == 40.0
    assert (reading.costs.prefill_overhead_s, reading.costs.prefill_per_token_s) == (0.017, 0.0001)
    assert (reading.costs.decode_overhead_s, reading.costs.decode_per_request_s) == (0.0, 0.0)   # none: by slots
    measured = observe.observation({**answers(), "decode_cost": [({"term": "overhead"}, 0.017),
                                                                 ({"term": "per_request"}, 0.0005)]}, NOW)
    assert (measured.costs.decode_overhead_s, measured.costs.decode_per_request_s) == (0.017, 0.0005)
    unmeasured = observe.observation(answers(cost=(math.nan, math.nan)), NOW)
    assert unmeasured.observation is not None and unmeasured.costs is None
    missing = observe.observation({**answers(), "arrivals": []}, NOW)
    assert missing.observation is None and missing.reason == "MetricsMissing"
    assert "laps_gateway_arrivals_total" in missing.message


def test_the_queries_select_this_clusters_pods_only():
    q = observe.queries(REF, 30)
    assert 'pod=~"c-prefill-[0-9]+"' in q["cost"] and 'namespace="ns"' in q["cost"]
    assert "c-decode-" in q["decode"] and "c-gateway-" in q["arrivals"] and "[30000ms]" in q["arrivals"]


def test_a_prometheus_answer_that_is_not_a_vector_is_an_error_naming_it():
    with pytest.raises(ValueError, match="not an instant vector"):
        observe.instant({"status": "success", "data": {"resultType": "matrix", "result": []}}, 200)
    with pytest.raises(ValueError, match="bad_data"):
        observe.instant({"status": "error", "error": "bad_data"}, 400)


def test_the_pools_run_the_planners_counts_only_while_autoscaling_is_on():
    parsed = parse_spec(spec())
    assert replicas_in_force(parsed, {}) is parsed                        # the starting point: the spec's
    on = replicas_in_force(parsed, {"autoscaling": {"desired": {"prefill": 5, "decode": 3}}})
    assert (on.prefill.replicas, on.decode.replicas) == (5, 3)
    clamped = replicas_in_force(parsed, {"autoscaling": {"desired": {"prefill": 50, "decode": 0}}})
    assert (clamped.prefill.replicas, clamped.decode.replicas) == (6, 1)
    off = parse_spec(spec(enabled=False))
    assert replicas_in_force(off, {"autoscaling": {"desired": {"prefill": 5, "decode": 3}}}) is off
    # Every reader of the spec in force sees them (the workloads are rendered from it).
    assert parse_cluster(lapscluster({"autoscaling": {"desired": {"prefill": 4, "decode": 2}}})).prefill.replicas == 4


def test_limits_a_budget_cannot_hold_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="cannot hold the minimum pools"):
        config_of(parse_spec(spec(gpuBudget=1)))
    assert slo_of(parse_spec(spec())).ttft_s["short"] == 0.5


def test_the_planners_memory_survives_a_round_trip_through_status():
    kube = FakeKube()
    kube.add(lapscluster())
    step(kube, "ns", "c", observe.observation(answers(), NOW), NOW, "uid-1")
    status = kube.get(cr_ref("ns", "c"))["status"]
    state = state_from_status(status)
    assert state.needs and state.last_rate[1] == pytest.approx(26.0)
    assert state_to_status(state) == status["autoscaling"]["planner"]


def test_a_step_sets_the_counts_within_the_budget_and_says_why(cluster_metrics):
    kube = FakeKube()
    kube.add(lapscluster())
    outcome = step(kube, "ns", "c", observe.observation(answers(rate=(60.0, 20.0)), NOW), NOW, "uid-1")
    auto = kube.get(cr_ref("ns", "c"))["status"]["autoscaling"]
    assert outcome.changed and auto["desired"]["prefill"] > 2
    assert auto["desired"]["prefill"] + auto["desired"]["decode"] <= 8            # one GPU a pod, budget 8
    assert auto["actual"] == {"prefill": 0, "decode": 0} and "req/s" in auto["lastDecision"]
    frozen = condition(kube.get(cr_ref("ns", "c"))["status"]["conditions"], FROZEN)
    assert frozen["status"] == "False" and frozen["reason"] == "Planning"
    assert metrics.PLANNER_REPLICAS.labels(cluster="ns/c", pool="prefill", kind="desired")._value.get() == \
        auto["desired"]["prefill"]


def test_new_prefill_pods_join_the_group_the_planner_says_needs_them():
    """The planner's split reaches Kubernetes: status.autoscaling.shortNeed, and the group sync
    puts new prefill pods in short until it has that many (then long), while autoscaling is on."""
    kube = FakeKube()
    kube.add(lapscluster())
    step(kube, "ns", "c", observe.observation(answers(rate=(60.0, 20.0)), NOW), NOW, "uid-1")
    live = kube.get(cr_ref("ns", "c"))
    auto = live["status"]["autoscaling"]
    need, desired = auto["shortNeed"], auto["desired"]["prefill"]
    assert 1 <= need < desired
    parsed = parse_spec(live["spec"])
    assert short_need(parsed, live) == need
    plan = plan_groups("c-prefill", desired, [], {"short": ["c-prefill-0"], "long": ["c-prefill-1"]},
                       short_target=short_need(parsed, live))
    assert len(plan.groups["short"]) == need and len(plan.groups["long"]) == desired - need
    assert short_need(parse_spec({**live["spec"], "autoscaling": {"enabled": False}}), live) is None


def test_missing_metrics_freeze_the_counts_and_the_condition_says_why():
    kube = FakeKube()
    kube.add(lapscluster({"autoscaling": {"desired": {"prefill": 3, "decode": 2}}}))
    missing = observe.Reading(None, None, "MetricsMissing", "cannot query http://prometheus:9090: ConnectError")
    outcome = step(kube, "ns", "c", missing, NOW, "uid-1")
    status = kube.get(cr_ref("ns", "c"))["status"]
    assert not outcome.changed and outcome.became_frozen
    assert status["autoscaling"]["desired"] == {"prefill": 3, "decode": 2}
    frozen = condition(status["conditions"], FROZEN)
    assert frozen["status"] == "True" and frozen["reason"] == "MetricsMissing" and "ConnectError" in frozen["message"]
    unmeasured = step(kube, "ns", "c", observe.observation(answers(cost=(math.nan, math.nan)), NOW), NOW, "uid-1")
    assert unmeasured.decision.frozen
    assert condition(kube.get(cr_ref("ns", "c"))["status"]["conditions"], FROZEN)["reason"] == "CostsUnknown"


def test_with_autoscaling_off_the_loop_writes_nothing_and_clears_what_it_wrote():
    kube = FakeKube()
    kube.add(lapscluster(enabled=False))
    reads = []
    loop = PlannerLoop(kube, "ns", "c", "uid-1", clock=lambda: 1000.0, wall=lambda: NOW,
                       read=lambda *a: reads.append(a))
    before = dict(kube.get(cr_ref("ns", "c")))
    delay, outcome = loop.tick()
    assert outcome is None and reads == [] and kube.get(cr_ref("ns", "c")) == before and delay > 0
    # Turned off after it ran: its counts and memory go, the condition says it is off.
    kube.add(lapscluster({"autoscaling": {"desired": {"prefill": 4, "decode": 2}}}, enabled=False))
    loop.tick()
    status = kube.get(cr_ref("ns", "c"))["status"]
    assert status.get("autoscaling") is None
    assert condition(status["conditions"], FROZEN)["reason"] == "AutoscalingOff"


def test_the_first_decision_comes_one_interval_after_the_loop_starts():
    kube = FakeKube()
    kube.add(lapscluster())
    clock = [1000.0]
    loop = PlannerLoop(kube, "ns", "c", "uid-1", clock=lambda: clock[0], wall=lambda: NOW,
                       read=lambda *a: observe.observation(answers(), NOW))
    delay, outcome = loop.tick()
    assert outcome is None and delay == pytest.approx(30.0)
    clock[0] += 30.0
    _, outcome = loop.tick()
    assert outcome is not None and outcome.decision is not None
    assert Pools(outcome.decision.prefill, outcome.decision.decode) != Pools(0, 0)


def test_a_prefill_scale_down_takes_the_highest_ordinals_out_of_routing_before_the_count_drops():
    # Wanted 2 of 4: c-prefill-2 and -3 leave routing first; the count stays until they drained.
    first = drain_step("c-prefill", 4, 2, None, NOW, drained=False, deadline_s=120)
    assert first.prefill == 4 and first.relabel == {"c-prefill-2": "draining", "c-prefill-3": "draining"}
    assert first.draining == {"pods": ["c-prefill-2", "c-prefill-3"], "target": 2, "since": NOW}
    waiting = drain_step("c-prefill", 4, 2, first.draining, NOW + 30, drained=False, deadline_s=120)
    assert waiting.prefill == 4 and waiting.relabel == {}
    done = drain_step("c-prefill", 4, 2, first.draining, NOW + 30, drained=True, deadline_s=120)
    assert done.prefill == 2 and done.draining is None
    late = drain_step("c-prefill", 4, 2, first.draining, NOW + 120, drained=False, deadline_s=120)
    assert late.prefill == 2   # what is left, each finishes as it terminates
    # Wanted back meanwhile: the label goes, the pods rejoin the groups.
    back = drain_step("c-prefill", 4, 4, first.draining, NOW + 30, drained=False, deadline_s=120)
    assert back.prefill == 4 and back.draining is None and back.relabel == {"c-prefill-2": None, "c-prefill-3": None}
    # Wanted even fewer: one more pod leaves, and the wait starts again.
    fewer = drain_step("c-prefill", 4, 1, first.draining, NOW + 30, drained=True, deadline_s=120)
    assert fewer.prefill == 4 and fewer.relabel == {"c-prefill-1": "draining"} and fewer.draining["target"] == 1


def test_a_draining_pod_is_in_no_group_and_keeps_its_label():
    pods = [PodView(f"c-prefill-{i}", g, ready=True) for i, g in enumerate(("short", "short", "long", DRAINING))]
    planned = plan_groups("c-prefill", 4, pods, {"short": ["c-prefill-0", "c-prefill-1"],
                                                 "long": ["c-prefill-2", "c-prefill-3"]})
    assert planned.groups == {"short": ["c-prefill-0", "c-prefill-1"], "long": ["c-prefill-2"]}
    assert "c-prefill-3" not in planned.label_changes


def test_a_step_drains_before_it_lowers_the_statefulset():
    kube = FakeKube()
    kube.add(lapscluster({"autoscaling": {"desired": {"prefill": 4, "decode": 1}}}, scaleDownStabilizationSeconds=0))
    for i in range(4):
        kube.add({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"c-prefill-{i}", "namespace": "ns",
            "labels": {"laps.io/cluster": "c", "laps.io/role": "prefill", "laps.io/prefill-group": "short"}}})
    idle = observe.observation(answers(rate=(0.5, 0.1), decode=0.0), NOW)
    outcome = step(kube, "ns", "c", idle, NOW, "uid-1")
    auto = kube.get(cr_ref("ns", "c"))["status"]["autoscaling"]
    assert auto["desired"]["prefill"] == 4 and auto["draining"]["target"] < 4 and not outcome.changed
    leaving = auto["draining"]["pods"]
    assert leaving[-1] == "c-prefill-3"
    assert {kube.get(Ref("v1", "Pod", "ns", p))["metadata"]["labels"]["laps.io/prefill-group"] for p in leaving} == \
        {DRAINING}
    outcome = step(kube, "ns", "c", idle, NOW + 30, "uid-1", drained=True)
    auto = kube.get(cr_ref("ns", "c"))["status"]["autoscaling"]
    assert outcome.changed and auto["desired"]["prefill"] == 4 - len(leaving) and auto.get("draining") is None


def test_a_decode_scale_down_lets_the_pods_holding_the_fewest_requests_go_first():
    kube = FakeKube()
    kube.add(lapscluster({"autoscaling": {"desired": {"prefill": 1, "decode": 3}}}))
    held = {"c-decode-7c9d5b6f8-b2b2b": 9.0, "c-decode-7c9d5b6f8-c4c4c": 0.0, "c-decode-7c9d5b6f8-d5d5d": 4.0}
    for name in held:
        kube.add({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "ns", "labels": {"laps.io/cluster": "c", "laps.io/role": "decode"},
            "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-100"} if held[name] == 9.0 else {}}})
    quiet = observe.observation({**answers(rate=(0.5, 0.1)), "decode": [({"pod": n}, v) for n, v in held.items()]},
                                NOW)
    step(kube, "ns", "c", quiet, NOW, "uid-1")
    decode = kube.get(cr_ref("ns", "c"))["status"]["autoscaling"]["desired"]["decode"]
    assert decode < 3
    costs = {n: (kube.get(Ref("v1", "Pod", "ns", n))["metadata"].get("annotations") or {})
             .get("controller.kubernetes.io/pod-deletion-cost") for n in held}
    leaving = sorted(held, key=held.get)[:3 - decode]
    assert {n for n, c in costs.items() if c == "-100"} == set(leaving)   # the busiest one lost its mark
