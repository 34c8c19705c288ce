"""The closed loop end to end with real parts: a real Prometheus scrapes a real
`laps gateway --discovery kubernetes` that routes to emulated engine processes; the real
`laps operator` reads the pressure from that Prometheus, moves a prefill pod between the short
and long groups by its label, and the gateway follows through the EndpointSlices.

What the emulator cannot show, and who plays it (tests/e2e/operator/serving_stack.py): no
StatefulSet/Deployment controller or kubelet, so the test creates the pods (Running and Ready
at 127.0.0.1, with the ports where each process listens); no endpoints controller, so the test
rewrites the Services' EndpointSlices whenever a pod's labels change (a move reaches the
gateway only through them); no downward API, so the test rewrites each engine's labels file.
Prometheus scrapes the gateway as the rendered PodMonitor would: the `namespace` and `pod`
labels of a Kubernetes target, so the operator's default query selects it as in a cluster.
"""
from __future__ import annotations

import httpx
import kubernetes

from laps_agent.policy.classes import CLASSES
from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.serving_stack import (
    NS,
    SERVED,
    Controllers,
    Load,
    pod_for,
    run_pod,
    start_engines,
    stop_engines,
)
from tests.e2e.operator.test_operator_e2e import Cluster
from tests.support import fixtures_prometheus
from tests.support.fixtures_prometheus import ScrapeTarget

NAME = "c"
GATEWAY_POD = "c-gateway-6b7d9c5f4-x8k2p"   # as a Deployment names its pods
PREFILL = [f"c-prefill-{i}" for i in range(4)]
THRESHOLD = 256
LONG, SHORT = 2000, 200


def lapscluster(prometheus_url: str) -> dict:
    return {"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster", "metadata": {"name": NAME},
            "spec": {"model": {"name": "emulated", "path": "/models/none.gguf", "servedName": SERVED},
                     "prefill": {"replicas": 4}, "decode": {"replicas": 1},
                     "laps": {"lengthThreshold": THRESHOLD, "allocation": {
                         "enabled": True, "intervalSeconds": 1, "ratio": 2.0, "minPerGroup": 1,
                         "confirmIntervals": 2}},   # cooldownSeconds: the default 60
                     "monitoring": {"prometheusURL": prometheus_url}}}


def gateway_groups(url: str) -> dict[str, list[str]]:
    status = httpx.get(url + "/laps_status", timeout=5).json()
    return {g: sorted(p["name"] for p in status["groups"][g]["pods"]) for g in CLASSES}


def test_pressure_moves_a_prefill_pod_and_the_gateway_follows(kube_api, start_operator, gateway_process,
                                                             prometheus_server, monkeypatch, tmp_path):
    client = kube_api.api_client()
    core, apps = kubernetes.client.CoreV1Api(client), kubernetes.client.AppsV1Api(client)
    engines = start_engines([(n, "prefill") for n in PREFILL] + [("c-decode-5f6d7c8b9-q2w3e", "decode")],
                            tmp_path, THRESHOLD)
    controllers = None
    loads: list[Load] = []
    try:
        gateway = gateway_process(
            "--discovery", "kubernetes", "--namespace", NS, "--prefill-short-service", "c-prefill-short",
            "--prefill-long-service", "c-prefill-long", "--decode-service", "c-decode", "--host", "127.0.0.1",
            "--port", "0", "--length-threshold", str(THRESHOLD), "--served-model-name", SERVED)
        gateway_url = gateway.wait_listening()
        target = ScrapeTarget(gateway_url, pod=GATEWAY_POD)
        prometheus = prometheus_server([target], namespace=NS, scrape_interval="1s")

        operator = start_operator()
        cluster = Cluster(kube_api, NAME)
        cluster.create(lapscluster(prometheus.url))

        # Act as the workload controllers and the kubelet for the operator's workloads.
        sts = wait_for(cluster.statefulset, "the prefill StatefulSet")
        for engine in engines[:4]:
            run_pod(core, pod_for(engine.name, sts.spec.template.metadata.labels,
                                  ("StatefulSet", sts.metadata.name, sts.metadata.uid),
                                  {"http": engine.port, "bootstrap": engine.bootstrap_port}))
        for deployment, pod, port in (("c-decode", engines[4].name, engines[4].port),
                                      ("c-gateway", GATEWAY_POD, int(gateway_url.rsplit(":", 1)[1]))):
            dep = wait_for(lambda d=deployment: apps.read_namespaced_deployment(d, NS), deployment)
            run_pod(core, pod_for(pod, dep.spec.template.metadata.labels,
                                  ("ReplicaSet", pod.rsplit("-", 1)[0], dep.metadata.uid), {"http": port}))
        controllers = Controllers(kube_api, engines)
        controllers.start()
        initial = {"short": PREFILL[:2], "long": PREFILL[2:]}
        wait_for(lambda: gateway_groups(gateway_url) == initial, "the gateway to discover the initial groups")
        prometheus.wait_targets_up()

        # --- 1. Long prompts pile up: a short pod becomes long and gets long work. -------------
        by_name = {e.name: e for e in engines}
        assert by_name["c-prefill-1"].metric("laps_engine_prefill_latency_seconds_count", **{"class": "long"}) == 0
        loads = [Load(gateway_url, LONG, clients=4).start(), Load(gateway_url, 20, clients=1).start()]
        status = wait_for(lambda: (cluster.status().get("allocation") or {}).get("history") and cluster.status(),
                          "a move", timeout=90)
        [move] = status["allocation"]["history"]
        # Equal in-flight work (not exported per pod): the highest ordinal of short moves.
        assert (move["pod"], move["from"], move["to"]) == ("c-prefill-1", "short", "long")
        assert status["groups"] == {"short": ["c-prefill-0"], "long": ["c-prefill-1", "c-prefill-2", "c-prefill-3"]}
        assert status["groupSizes"] == {"short": 1, "long": 3}
        assert status["lastRebalanceTime"] == move["time"]
        assert status["pressure"]["source"] == "prometheus" and status["pressure"]["long"] > status["pressure"]["short"]
        assert status["allocation"]["policy"]["lastDirection"] == "short_to_long"
        assert cluster.pod_groups()["c-prefill-1"] == "long"
        wait_for(lambda: any(r == "Rebalanced" and "c-prefill-1 moved short -> long" in m for r, m in cluster.events()),
                 "a Rebalanced event")
        assert operator.metric("laps_operator_rebalances_total", cluster="default/c", direction="short_to_long") == 1
        assert operator.metric("laps_operator_group_size", cluster="default/c", group="long") == 3
        assert (operator.metric("laps_operator_pressure", cluster="default/c", group="long") or 0) > 0

        # The gateway follows the EndpointSlices and sends long prompts to the moved pod; the
        # engine reads its new group from its labels.
        wait_for(lambda: gateway_groups(gateway_url) == {"short": ["c-prefill-0"], "long": PREFILL[1:]},
                 "the gateway to see c-prefill-1 in the long group")
        wait_for(lambda: by_name["c-prefill-1"].metric("laps_engine_prefill_latency_seconds_count",
                                                       **{"class": "long"}) > 0, "long work on c-prefill-1")
        # (The group comes from the pod's labels file, which the stand-in kubelet rewrites on its own
        # round: it may lag the EndpointSlices the gateway follows.)
        wait_for(lambda: httpx.get(by_name["c-prefill-1"].url + "/get_server_info").json()["prefill_group"] == "long",
                 "c-prefill-1 to report its new group")
        for load in loads:
            load.stop()
        assert not [f for load in loads for f in load.failures], loads

        # --- 2. Prometheus goes away: pressure unknown, no move, a condition says why. ----------
        port = prometheus.port
        prometheus.stop()
        # Short prompts now crowd the one short pod: with pressure known this would move a pod.
        loads = [Load(gateway_url, SHORT, clients=6).start()]
        # (A query caught by the shutdown itself may first say PrometheusError: wait for the cause.)
        unavailable = wait_for(lambda: (c := cluster.condition("PressureUnavailable")) and c["status"] == "True"
                               and c["reason"] == "PrometheusUnreachable" and c, "the PressureUnavailable condition")
        assert prometheus.url in unavailable["message"]
        unknown_before = operator.metric("laps_operator_allocation_decisions_total", cluster="default/c",
                                         result="unknown")
        # Several decisions pass while it is down; none moves anything.
        wait_for(lambda: operator.metric("laps_operator_allocation_decisions_total", cluster="default/c",
                                         result="unknown") >= unknown_before + 4, "decisions while Prometheus is down")
        assert len(cluster.status()["allocation"]["history"]) == 1
        assert cluster.pod_groups() == {"c-prefill-0": "short", "c-prefill-1": "long", "c-prefill-2": "long",
                                        "c-prefill-3": "long"}
        assert "short" not in cluster.status()["pressure"]
        assert operator.metric("laps_operator_pressure", cluster="default/c", group="long") is None
        wait_for(lambda: any(r == "PressureUnavailable" for r, _ in cluster.events()), "a PressureUnavailable event")

        # --- 3. Prometheus is back (same address): the condition clears, the loop decides again.
        monkeypatch.setattr(fixtures_prometheus, "_free_port", lambda: port)
        prometheus_server([target], namespace=NS, scrape_interval="1s")
        recovered = wait_for(lambda: (c := cluster.condition("PressureUnavailable")) and c["status"] == "False" and c,
                             "the condition to clear", timeout=60)
        assert recovered["reason"] == "Recovered"
        # The short-heavy load is still on: undoing the first move's direction (ratio^2) moves
        # a long pod back to short: the highest ordinal (c-prefill-1 is also in its 60 s cooldown).
        history = wait_for(lambda: len(h := cluster.status()["allocation"]["history"]) >= 2 and h,
                           "a second move", timeout=60)
        assert (history[1]["pod"], history[1]["from"], history[1]["to"]) == ("c-prefill-3", "long", "short")
        wait_for(lambda: cluster.pod_groups()["c-prefill-3"] == "short", "c-prefill-3 relabelled short")
        assert operator.metric("laps_operator_rebalances_total", cluster="default/c", direction="long_to_short") >= 1
        wait_for(lambda: any(r == "PressureRecovered" for r, _ in cluster.events()), "a PressureRecovered event")
        assert controllers.errors == []
    finally:
        for load in loads:
            load.stop()
        if controllers is not None:
            controllers.stop()
        stop_engines(engines)
