"""The operator restarted while its clusters live and rebalance (a rollout, a node drain, an OOM
kill): a new `laps operator` process goes on from what the API server holds, and the users'
routing does not change under their feet.

What the emulator cannot show, and who plays it: no StatefulSet controller or kubelet, so the
test creates the prefill pods and a gateway pod whose /metrics is a tiny HTTP server of the test
(the operator reads pressure from it on its no-Prometheus path); an OOM kill is a SIGKILL of
the operator process.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import kmock
import pytest

from laps_agent.policy.classes import CLASSES
from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.serving_stack import NS, GatewayStandIn, pod_for, run_pod
from tests.e2e.operator.test_operator_e2e import GROUP_LABEL, Cluster

CR = "laps.io/v1alpha1/lapsclusters"


@pytest.fixture
def gateway() -> Iterator[GatewayStandIn]:
    stand_in = GatewayStandIn()
    try:
        yield stand_in
    finally:
        stand_in.close()


def running(kube_api, gateway: GatewayStandIn, name: str, **allocation) -> Cluster:
    """A 4-pod cluster with allocation on (one decision a second), its pods made and labelled."""
    cluster = Cluster(kube_api, name)
    cluster.create({"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster", "metadata": {"name": name},
                    "spec": {"model": {"name": "m", "path": "/models/m.gguf"}, "prefill": {"replicas": 4},
                             "laps": {"allocation": {"enabled": True, "intervalSeconds": 1, **allocation}}}})
    wait_for(cluster.statefulset, "the prefill StatefulSet")
    cluster.act_as_statefulset_controller(ready=True)
    deployment = wait_for(lambda: cluster.apps.read_namespaced_deployment(f"{name}-gateway", NS), "the gateway")
    run_pod(cluster.core, pod_for(f"{name}-gateway-5c6d7b8f9-bcdfg", deployment.spec.template.metadata.labels,
                                  ("ReplicaSet", f"{name}-gateway-5c6d7b8f9", deployment.metadata.uid),
                                  {"http": gateway.port}))
    wait_for(lambda: sorted(cluster.pod_groups().values()) == ["long", "long", "short", "short"], "initial groups")
    return cluster


def label_history(kube_api, pod: str) -> list[str | None]:
    """Every group label the pod ever carried, repeats folded."""
    labels = [(v["metadata"].get("labels") or {}).get(GROUP_LABEL) for v in kube_api.history("v1/pods", NS, pod)]
    return [g for i, g in enumerate(labels) if i == 0 or g != labels[i - 1]]


def test_an_operator_killed_between_recording_a_move_and_relabelling_is_finished_by_the_next(
        kube_api, start_operator, gateway):
    first = start_operator()
    cluster = running(kube_api, gateway, "crash", confirmIntervals=1, cooldownSeconds=0)
    # The API server refuses pod writes from now on: the next move is recorded in status but
    # its label write fails, and every later step stops at that label (the group sync first).
    refusing = threading.Event()
    refusing.set()
    unavailable = kmock.Response(status=503, payload={
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503, "message": "etcd is slow"})
    # (NotImplemented: not this reaction's request, the emulator serves it.)
    kube_api.call(lambda: kube_api.emulator["patch", kmock.resource("", "v1", "pods")]
                  << (lambda: unavailable if refusing.is_set() else NotImplemented))
    gateway.pressure = {"short": 0.0, "long": 2.0}
    wait_for(lambda: (cluster.status().get("allocation") or {}).get("history"), "the move recorded")
    wait_for(lambda: (cluster.condition("WritesFailing") or {}).get("status") == "True", "WritesFailing")
    recorded = cluster.status()
    [move] = recorded["allocation"]["history"]
    assert cluster.pod_groups()[move["pod"]] == "short"   # recorded, not yet relabelled
    first.process.send_signal(signal.SIGKILL)   # as the OOM killer would: no clean-up at all
    first.process.wait(10)

    refusing.clear()
    gateway.pressure = {"short": 0.0, "long": 0.0}   # quiet: nothing more to move
    second = start_operator()
    wait_for(lambda: cluster.pod_groups()[move["pod"]] == "long", "the move finished by the new operator")
    wait_for(lambda: (cluster.condition("WritesFailing") or {}).get("status") == "False", "WritesFailing cleared")
    wait_for(lambda: (second.metric("laps_operator_allocation_decisions_total", cluster=f"{NS}/crash",
                                    result="held") or 0) >= 2, "two decisions of the new operator")
    status = cluster.status()
    assert status["groups"] == recorded["groups"] and status["allocation"]["history"] == [move]
    assert cluster.pod_groups() == {p: g for g in CLASSES for p in recorded["groups"][g]}
    # No pod went back to a default split on the way: the moved one changed once, the others never.
    for pod in cluster.pod_groups():
        expected = ["short", "long"] if pod == move["pod"] else [cluster.pod_groups()[pod]]
        assert label_history(kube_api, pod)[1:] == expected, (pod, label_history(kube_api, pod))


def test_a_restart_after_moves_keeps_the_groups_and_writes_nothing(kube_api, start_operator, gateway):
    first = start_operator()
    cluster = running(kube_api, gateway, "moved", confirmIntervals=1, cooldownSeconds=0, minPerGroup=1)
    gateway.pressure = {"short": 0.0, "long": 2.0}
    wait_for(lambda: (cluster.status().get("allocation") or {}).get("lastDecision") == "short is at its minimum of 1 pods",
             "moves until short keeps its minimum")
    groups = cluster.pod_groups()
    assert sorted(groups.values()) == ["long", "long", "long", "short"]
    # Quiet before the restart: a rate read over an interval differs from one interval to the
    # next by the readings' timing, and each new figure is written to status.pressure.
    gateway.pressure = {"short": 0.0, "long": 0.0}
    wait_for(lambda: (cluster.status().get("allocation") or {}).get("lastDecision") == "no group is under pressure",
             "a quiet decision")
    first.stop()
    pods = {pod: kube_api.find("v1/pods", NS, pod)["metadata"]["resourceVersion"] for pod in groups}
    versions = len(kube_api.history(CR, NS, "moved"))

    second = start_operator()
    wait_for(lambda: (second.metric("laps_operator_allocation_decisions_total", cluster=f"{NS}/moved",
                                    result="held") or 0) >= 2, "two decisions of the new operator")
    assert cluster.pod_groups() == groups
    assert {pod: kube_api.find("v1/pods", NS, pod)["metadata"]["resourceVersion"] for pod in groups} == pods
    new = kube_api.history(CR, NS, "moved")[versions:]
    assert new == [], [v.get("status") for v in new]


def test_a_move_wanted_before_a_restart_needs_its_confirmations_again(kube_api, start_operator, gateway):
    first = start_operator()
    cluster = running(kube_api, gateway, "wanted", confirmIntervals=2, cooldownSeconds=0)
    wait_for(lambda: (cluster.status().get("allocation") or {}).get("lastDecision") == "no group is under pressure",
             "the loop deciding on a quiet cluster")
    first.stop()
    # What an operator stopped long ago left: a move wanted once, one confirmation short. The
    # long group is under pressure again only now, after the restart.
    cluster.custom.patch_namespaced_custom_object_status(
        "laps.io", "v1alpha1", NS, "lapsclusters", "wanted",
        {"status": {"allocation": {"policy": {"wanted": "short_to_long", "streak": 1}}}},
        _content_type="application/merge-patch+json")
    versions = len(kube_api.history(CR, NS, "wanted"))
    gateway.pressure = {"short": 0.0, "long": 2.0}

    start_operator()
    wait_for(lambda: (cluster.status().get("allocation") or {}).get("history"), "the move")
    decisions = [(v.get("status") or {}).get("allocation", {}).get("lastDecision")
                 for v in kube_api.history(CR, NS, "wanted")[versions:]]
    decisions = [d for i, d in enumerate(decisions) if d and (i == 0 or d != decisions[i - 1])]
    # confirmIntervals counts intervals in a row: the first reading after the restart is the
    # first of them, whatever the operator before it wanted.
    assert decisions[0] == "short_to_long wanted (1/2)", decisions
