"""The planner end to end: the real `laps operator` with `spec.autoscaling` on reads what a real
Prometheus scraped, sets the prefill StatefulSet's and the decode Deployment's replicas within
the GPU budget, writes status and Events, freezes and says why when Prometheus goes, and writes
nothing once autoscaling is off (a user's replica edit stands).

What this cannot show, and who plays it: the series Prometheus scrapes come from stand-ins for
the gateway's and the engines' /metrics (the demand counters grow at rates the test sets, the
prefill cost is a 32B model's on an H200), so the numbers are the test's, not measured traffic:
the gateway's own counting is tested with the gateway (tests/unit/gateway_policy); no workload
controller makes the pods (the emulator has none), so `actual` stays at what the test created,
and pods draining on scale-down are the real control plane's (tests/cluster)."""
from __future__ import annotations

import time

import kubernetes

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_operator_e2e import NS, Cluster
from tests.support.fixtures_prometheus import ScrapeTarget
from tests.support.planner_metrics import PREFILL_COST, Demand, engine_metrics

NAME = "c"
GATEWAY_POD = "c-gateway-6b7d9c5f4-x8k2p"   # as a Deployment names its pods
DECODE_POD = "c-decode-7c9d5b6f8-z4m2q"
BUDGET = 6


def lapscluster(prometheus_url: str) -> dict:
    return {"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster", "metadata": {"name": NAME},
            "spec": {"model": {"name": "m", "path": "/models/m"}, "engine": {"device": "cuda"},
                     "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                     "monitoring": {"prometheusURL": prometheus_url},
                     "slo": {"ttftP90Seconds": {"short": 0.5, "long": 3.0}, "itlP90Seconds": 0.05},
                     "autoscaling": {"enabled": True, "intervalSeconds": 2, "gpuBudget": BUDGET,
                                     "prefill": {"min": 1, "max": 4}, "decode": {"min": 1, "max": 3},
                                     "startupSeconds": 0, "scaleDownStabilizationSeconds": 0}}}


def test_the_planner_sizes_the_pools_within_the_budget_freezes_without_metrics_and_yields_when_off(
        kube_api, start_operator, prometheus_server):
    apps = kubernetes.client.AppsV1Api(kube_api.api_client())
    demand = Demand()
    prefill_engine = engine_metrics(PREFILL_COST)
    decode_engine = engine_metrics("laps_engine_running_requests 40\n")
    try:
        prometheus = prometheus_server([ScrapeTarget(demand.http.url, pod=GATEWAY_POD),
                                        ScrapeTarget(prefill_engine.url, pod="c-prefill-0"),
                                        ScrapeTarget(decode_engine.url, pod=DECODE_POD)],
                                       namespace=NS, scrape_interval="1s")
        prometheus.wait_targets_up()
        operator = start_operator()
        cluster = Cluster(kube_api, NAME)
        cluster.create(lapscluster(prometheus.url))

        def replicas() -> tuple[int, int]:
            return (apps.read_namespaced_stateful_set("c-prefill", NS).spec.replicas,
                    apps.read_namespaced_deployment("c-decode", NS).spec.replicas)

        assert wait_for(lambda: replicas() == (1, 1) or None, "the pools at the spec's replicas") is not None

        # --- 1. Demand arrives: both pools grow, within the budget, and status says why. -----
        demand.set("short", 20.0, 136, 150)
        demand.set("long", 8.0, 1800, 150)
        # The rate Prometheus reports ramps up over its window, so the first decisions may grow
        # one pool alone; every state seen on the way stays within the budget (one GPU a pod).
        seen: list[tuple[int, int]] = []

        def both_grown() -> tuple[int, int] | None:
            seen.append(r := replicas())
            return r if min(r) > 1 else None

        wait_for(both_grown, "both pools to grow", timeout=60)
        assert all(sum(r) <= BUDGET for r in seen), seen
        auto = wait_for(lambda: (a := cluster.status().get("autoscaling")) and a["desired"]["prefill"] > 1 and a,
                        "status.autoscaling")
        assert (auto["desired"]["prefill"], auto["desired"]["decode"]) == replicas()
        assert "req/s" in auto["lastDecision"] and auto["planner"]["needs"]
        assert cluster.condition("AutoscalingFrozen")["status"] == "False"
        wait_for(lambda: any(r == "Scaled" and "prefill 1->" in m for r, m in cluster.events()), "a Scaled event")
        assert operator.metric("laps_operator_planner_replicas", cluster="default/c", pool="prefill",
                               kind="desired") == auto["desired"]["prefill"]
        assert operator.metric("laps_operator_planner_decisions_total", cluster="default/c", reason="scaled_up") >= 1
        # The budget holds on every later decision too.
        for _ in range(1):
            before = operator.metric("laps_operator_planner_decisions_total", cluster="default/c", reason="held") or 0
            wait_for(lambda b=before: (operator.metric("laps_operator_planner_decisions_total", cluster="default/c",
                                                       reason="held") or 0) > b or
                     (operator.metric("laps_operator_planner_decisions_total", cluster="default/c",
                                      reason="budget") or 0) > 0, "another decision", timeout=30)
            assert sum(replicas()) <= BUDGET

        # --- 2. Demand goes: back to the minimum (stabilisation 0 here). ---------------------
        demand.set("short", 0.0, 136, 150)
        demand.set("long", 0.0, 1800, 150)
        wait_for(lambda: replicas() == (1, 1) or None, "the pools back at the minimum", timeout=60)

        # --- 3. Prometheus goes: the counts stay, the condition and an Event say why. --------
        prometheus.stop()
        frozen = wait_for(lambda: (c := cluster.condition("AutoscalingFrozen")) and c["status"] == "True" and c,
                          "the AutoscalingFrozen condition", timeout=30)
        assert frozen["reason"] == "MetricsMissing" and prometheus.url in frozen["message"]
        wait_for(lambda: any(r == "AutoscalingFrozen" for r, _ in cluster.events()), "an AutoscalingFrozen event")
        assert replicas() == (1, 1)

        # --- 4. Autoscaling off: its status goes; a user's replica edit stands. -------------
        cluster.patch_spec({"autoscaling": {"enabled": False}, "prefill": {"replicas": 3}})
        wait_for(lambda: cluster.status().get("autoscaling") is None or None, "status.autoscaling removed")
        wait_for(lambda: replicas() == (3, 1) or None, "the user's prefill replicas")
        scaled = sum(r == "Scaled" for r, _ in cluster.events())
        # An absence is observed over time (three of the planner's intervals), not waited for.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            assert replicas() == (3, 1)
            assert sum(r == "Scaled" for r, _ in cluster.events()) == scaled
            time.sleep(1)
    finally:
        demand.http.close()
        prefill_engine.close()
        decode_engine.close()
