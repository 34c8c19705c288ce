"""A LAPSCluster deleted while its allocation loop is in the middle of a tick: the operator's
handlers and loops in this process (laps_operator.main, as kopf calls them), against the
Kubernetes API emulator on loopback and a loopback Prometheus whose answers the test holds.

What a user would see without the guard: a dashboard or alert on `laps_operator_*` series
showing a cluster that no longer exists until the operator restarts, and a cluster created
again under the same name getting the old one's pressure and decision in its status.
"""
from __future__ import annotations

import json
import threading
import time
import types

import kubernetes
import prometheus_client
import pytest

from laps_operator import main
from laps_operator.naming import API_VERSION, GROUP, KIND, PLURAL, VERSION
from laps_operator.reconcile.cycle import reconcile
from laps_operator.reconcile.kube import Kube
from tests.e2e.operator.conftest import CRD
from tests.support.get_server import GetServer
from tests.support.kube_gates import ApiGate
from tests.support.waiting import poll

NS = "default"


class HeldPrometheus:
    """Prometheus' instant-query API answering one fixed vector, but only once released: until
    then a query waits, as one to a slow or overloaded Prometheus does."""

    def __init__(self, short: float, long: float) -> None:
        self.released = threading.Event()
        self.waiting = 0
        self._vector = (("short", short), ("long", long))
        self._http = GetServer(self._query)
        self.url = self._http.url

    def _query(self) -> tuple[str, bytes]:
        self.waiting += 1
        self.released.wait(30)
        now = time.time()
        result = [{"metric": {"group": g}, "value": [now, str(v)]} for g, v in self._vector]
        return "application/json", json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

    def close(self) -> None:
        self.released.set()
        self._http.close()


@pytest.fixture
def memo(kube_api):
    """What the operator keeps for its handlers (kopf's memo), against the emulator; every
    cluster loop the test started is stopped at the end."""
    kube_api.apply_crd(CRD)
    try:
        yield types.SimpleNamespace(kube=Kube(kube_api.api_client()))
    finally:
        main.LOOPS.stop_all()


@pytest.fixture
def held(memo, kube_api):
    """Factories of held Prometheus servers and pod-patch gates; all released at the end (so
    that no loop thread waits on them)."""
    made: list = []

    def prometheus(short: float, long: float) -> HeldPrometheus:
        made.append(HeldPrometheus(short, long))
        return made[-1]

    def pod_patches() -> ApiGate:
        made.append(ApiGate(kube_api, "patch", "pods"))
        return made[-1]

    try:
        yield types.SimpleNamespace(prometheus=prometheus, pod_patches=pod_patches)
    finally:
        for gate in made:
            if isinstance(gate, HeldPrometheus):
                gate.close()
            else:
                gate.opened.set()


def lapscluster(name: str, prometheus_url: str, replicas: int = 4) -> dict:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"name": "m", "path": "/models/m.gguf"}, "prefill": {"replicas": replicas},
                     "laps": {"allocation": {"enabled": True, "intervalSeconds": 1, "confirmIntervals": 1,
                                             "cooldownSeconds": 0}},
                     "monitoring": {"prometheusURL": prometheus_url}}}


def exported(cluster: str) -> list[str]:
    """The operator's /metrics lines about one cluster, as Prometheus would scrape them."""
    text = prometheus_client.generate_latest().decode()
    return [line for line in text.splitlines() if f'cluster="{NS}/{cluster}"' in line]


def allocation_thread(name: str) -> threading.Thread:
    [thread] = [t for t in threading.enumerate() if t.name == f"allocation {NS}/{name}"]
    return thread


def seen(memo, event: str, body: dict) -> None:
    """What kopf does with a watch event of the LAPSCluster: the cluster watch handler."""
    main.cluster_seen(event={"type": event, "object": body}, body=body, memo=memo)


def test_a_move_in_flight_when_the_cluster_is_deleted_leaves_no_series_behind(kube_api, memo, held):
    custom = kubernetes.client.CustomObjectsApi(kube_api.api_client())
    core = kubernetes.client.CoreV1Api(kube_api.api_client())
    prometheus = held.prometheus(0.0, 4000.0)   # long prompts pile up: a short pod should move
    body = custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, lapscluster("gone", prometheus.url))
    for i in range(4):   # the StatefulSet's pods (the emulator runs no StatefulSet controller)
        core.create_namespaced_pod(NS, {
            "metadata": {"name": f"gone-prefill-{i}", "labels": {"laps.io/cluster": "gone", "laps.io/role": "prefill"}},
            "spec": {"containers": [{"name": "engine", "image": "x"}]}})
        # Ready, as the kubelet reports a pod that passed its probe: the loop moves only pods that serve.
        core.patch_namespaced_pod_status(f"gone-prefill-{i}", NS, {"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    reconcile(memo.kube, NS, "gone")   # the create handler's work: children, and the pods in their groups
    seen(memo, "ADDED", body)
    # (Quickly from here on: the loop's query gives up after pressure.TIMEOUT_S.)
    poll(lambda: prometheus.waiting, message="the allocation loop's first decision to ask Prometheus")
    pods = held.pod_patches()
    prometheus.released.set()
    poll(lambda: pods.held, message="the move's label write on its way to the API server")
    assert any("laps_operator_group_size" in line for line in exported("gone"))

    tick = allocation_thread("gone")
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "gone")
    seen(memo, "DELETED", body)
    assert exported("gone") == []
    pods.opened.set()
    tick.join(10)
    assert not tick.is_alive()
    # The tick finished its move after the cluster went: its series stay gone for good.
    assert exported("gone") == []


def test_a_cluster_created_again_gets_fresh_series_and_nothing_from_the_old_ones_tick(kube_api, memo, held):
    custom = kubernetes.client.CustomObjectsApi(kube_api.api_client())
    old_prometheus, new_prometheus = held.prometheus(0.0, 4000.0), held.prometheus(10.0, 20.0)
    old = custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, lapscluster("again", old_prometheus.url))
    seen(memo, "ADDED", old)
    poll(lambda: old_prometheus.waiting, message="the old cluster's loop to ask its Prometheus")
    old_tick = allocation_thread("again")

    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "again")
    seen(memo, "DELETED", old)
    assert exported("again") == []
    new = custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, lapscluster("again", new_prometheus.url))
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    seen(memo, "ADDED", new)
    fresh = 'laps_operator_allocation_decisions_total{cluster="default/again",result="held"} 0.0'
    assert fresh in exported("again")   # the new cluster's series, from zero

    old_prometheus.released.set()   # the old cluster's answer arrives: its tick goes on
    old_tick.join(10)
    assert not old_tick.is_alive()
    assert fresh in exported("again")
    assert not [line for line in exported("again") if line.startswith("laps_operator_pressure")]
    status = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "again").get("status") or {}
    assert "pressure" not in status and "allocation" not in status, status

    # The new cluster's own loop is not held back: its own pressure reaches status and series.
    new_prometheus.released.set()
    poll(lambda: (custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "again").get("status") or {})
         .get("pressure", {}).get("long") == 20.0, message="the new cluster's own pressure in its status")
    # The tick writes status first and its series after: wait for the series as well.
    poll(lambda: 'laps_operator_pressure{cluster="default/again",group="long"} 20.0' in exported("again"),
         message="the new cluster's own pressure in its series")
    seen(memo, "DELETED", new)
    assert exported("again") == []
