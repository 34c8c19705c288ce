"""Three writers of one cluster at once never revert each other: the update handler (a stream of
spec changes), the resync (every 0.3 s) and the allocation loop (a move every second or two),
all in the real `laps operator` against the API emulator, whose object history shows every
version ever stored, so a revert that was later repaired still shows.

What the emulator cannot show: no controllers or kubelet (the test creates the prefill pods);
the pressure comes from a stand-in for the gateway's /metrics (a pod whose port is a tiny HTTP
server of the test, read by the operator's no-Prometheus path) so that the test can turn it
from one group to the other after each move and keep the loop moving pods.
"""
from __future__ import annotations

import json

import kubernetes

from laps_agent.policy.classes import CLASSES
from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.serving_stack import NS, GatewayStandIn, pod_for, run_pod
from tests.e2e.operator.test_operator_e2e import Cluster

NAME = "race"
MOVES = 6
UPDATES_PER_MOVE = 3


def threshold_of(args: list[str]) -> int:
    return int(args[args.index("--length-threshold") + 1])


def sts_threshold(version: dict) -> int:
    return threshold_of(version["spec"]["template"]["spec"]["containers"][0]["args"])


def cm_threshold(version: dict) -> int:
    return json.loads(version["data"]["laps.json"])["laps"]["lengthThreshold"]


def test_spec_updates_resyncs_and_moves_together_revert_nothing(kube_api, start_operator):
    stand_in = GatewayStandIn()
    try:
        operator = start_operator(LAPS_OPERATOR_RESYNC_SECONDS="0.3")
        client = kube_api.api_client()
        core, apps = kubernetes.client.CoreV1Api(client), kubernetes.client.AppsV1Api(client)
        cluster = Cluster(kube_api, NAME)
        threshold = 300
        cluster.create({"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster", "metadata": {"name": NAME},
                        "spec": {"model": {"name": "m", "path": "/models/m.gguf"}, "prefill": {"replicas": 4},
                                 "laps": {"lengthThreshold": threshold, "allocation": {
                                     "enabled": True, "intervalSeconds": 1, "confirmIntervals": 1,
                                     "cooldownSeconds": 0}}}})
        wait_for(cluster.statefulset, "the prefill StatefulSet")
        cluster.act_as_statefulset_controller(ready=True)
        gateway = wait_for(lambda: apps.read_namespaced_deployment(f"{NAME}-gateway", NS), "the gateway")
        run_pod(core, pod_for(f"{NAME}-gateway-5c6d7b8f9-bcdfg", gateway.spec.template.metadata.labels,
                              ("ReplicaSet", f"{NAME}-gateway-5c6d7b8f9", gateway.metadata.uid),
                              {"http": stand_in.port}))
        wait_for(lambda: sorted(cluster.pod_groups().values()) == ["long", "long", "short", "short"], "groups")

        def moves() -> int:
            return int(sum(operator.metric("laps_operator_rebalances_total", cluster=f"default/{NAME}",
                                           direction=d) or 0 for d in ("short_to_long", "long_to_short")))

        # After each move, pressure turns to the other group (a reversal: ratio^2 is cleared)
        # while spec changes arrive one after another.
        stand_in.pressure = {"short": 0.0, "long": 2.0}
        for done in range(1, MOVES + 1):
            wait_for(lambda done=done: moves() >= done, f"move {done}", timeout=30)
            last = cluster.status()["allocation"]["history"][-1]
            hot = "short" if last["to"] == "long" else "long"
            stand_in.pressure = {hot: 2.0, ("long" if hot == "short" else "short"): 0.0}
            for _ in range(UPDATES_PER_MOVE):
                threshold += 1
                cluster.patch_spec({"laps": {"lengthThreshold": threshold}})

        # Quiet: no pressure, so after two decisions on a quiet window nothing moves any more.
        stand_in.pressure = {"short": 0.0, "long": 0.0}
        held = operator.metric("laps_operator_allocation_decisions_total", cluster=f"default/{NAME}", result="held")
        wait_for(lambda: operator.metric("laps_operator_allocation_decisions_total", cluster=f"default/{NAME}",
                                         result="held") >= held + 2, "two decisions without pressure")
        total = moves()
        assert total >= MOVES

        # The last spec is what every child holds...
        wait_for(lambda: sts_threshold(kube_api.find("apps/v1/statefulsets", NS, f"{NAME}-prefill")) == threshold,
                 "the last threshold in the StatefulSet")
        wait_for(lambda: cm_threshold(kube_api.find("v1/configmaps", NS, f"{NAME}-config")) == threshold,
                 "the last threshold in the ConfigMap")
        # ...and no older spec was ever written back over a newer one.
        for resource, name, read in (("apps/v1/statefulsets", f"{NAME}-prefill", sts_threshold),
                                     ("apps/v1/deployments", f"{NAME}-gateway",
                                      lambda v: threshold_of(v["spec"]["template"]["spec"]["containers"][0]["args"])),
                                     ("v1/configmaps", f"{NAME}-config", cm_threshold)):
            seen = [read(v) for v in kube_api.history(resource, NS, name)]
            assert seen == sorted(seen), f"{name} went back to an older spec: {seen}"
            assert seen[-1] == threshold

        # Every change of a pod's group and of the recorded membership is a move: a stale writer
        # putting a pod back would add a change that no move accounts for.
        status = cluster.status()
        assert {p: g for g in CLASSES for p in status["groups"][g]} == cluster.pod_groups()
        pod_changes = 0
        for pod in cluster.pod_groups():
            labels = [(v["metadata"].get("labels") or {}).get("laps.io/prefill-group")
                      for v in kube_api.history("v1/pods", NS, pod)]
            labels = [g for g in labels if g in CLASSES]
            pod_changes += sum(a != b for a, b in zip(labels, labels[1:]))
        recorded = [json.dumps(v.get("status", {}).get("groups"), sort_keys=True)
                    for v in kube_api.history("laps.io/v1alpha1/lapsclusters", NS, NAME)
                    if v.get("status", {}).get("groups")]
        recorded = [r for i, r in enumerate(recorded) if i == 0 or r != recorded[i - 1]]
        assert pod_changes == total, (pod_changes, total)
        assert len(recorded) - 1 == total, recorded
        last = status["allocation"]["history"][-1]
        assert cluster.pod_groups()[last["pod"]] == last["to"]
        assert "Traceback" not in operator.log()
    finally:
        stand_in.close()
