"""The opt-in EndpointSlice controller: Services + Pods -> EndpointSlices the gateway watches."""
from __future__ import annotations

import kubernetes
import pytest

SVC_LABEL = "kubernetes.io/service-name"


@pytest.fixture
def core(kube_api):
    kube_api.emulate_endpoint_slices()
    return kubernetes.client.CoreV1Api(kube_api.api_client())


def _pod(core, name: str, group: str, ip: str, ready: bool = True) -> None:
    core.create_namespaced_pod("serving", {
        "metadata": {"name": name, "labels": {"laps.io/role": "prefill", "laps.io/prefill-group": group}},
        "spec": {"containers": [{"name": "engine", "image": "laps", "ports": [
            {"name": "http", "containerPort": 30000}, {"name": "bootstrap", "containerPort": 8998}]}]}})
    core.patch_namespaced_pod_status(name, "serving", {"status": {
        "podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def _slice_for(kube_api, service: str):
    discovery = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    slices = discovery.list_namespaced_endpoint_slice("serving", label_selector=f"{SVC_LABEL}={service}")
    assert len(slices.items) == 1
    return slices.items[0]


def test_slices_follow_pods_selected_by_a_service(kube_api, core):
    core.create_namespaced_service("serving", {
        "metadata": {"name": "c1-prefill-short"},
        "spec": {"selector": {"laps.io/role": "prefill", "laps.io/prefill-group": "short"},
                 "ports": [{"name": "http", "port": 30000, "targetPort": "http"},
                           {"name": "bootstrap", "port": 8998, "targetPort": 8998}]}})
    _pod(core, "p0", "short", "10.0.0.1")
    _pod(core, "p1", "long", "10.0.0.2")
    _pod(core, "p2", "short", "10.0.0.3", ready=False)

    found = _slice_for(kube_api, "c1-prefill-short")
    assert {e.addresses[0]: e.conditions.ready for e in found.endpoints} == {"10.0.0.1": True, "10.0.0.3": False}
    assert {p.name: p.port for p in found.ports} == {"http": 30000, "bootstrap": 8998}

    # Relabelling a pod (what the operator does to rebalance) moves it between services.
    core.patch_namespaced_pod("p1", "serving", {"metadata": {"labels": {"laps.io/prefill-group": "short"}}})
    assert "10.0.0.2" in {e.addresses[0] for e in _slice_for(kube_api, "c1-prefill-short").endpoints}
    core.delete_namespaced_pod("p0", "serving")
    assert "10.0.0.1" not in {e.addresses[0] for e in _slice_for(kube_api, "c1-prefill-short").endpoints}


def test_deleting_the_service_removes_its_slice(kube_api, core):
    core.create_namespaced_service("serving", {"metadata": {"name": "svc"},
                                               "spec": {"selector": {"a": "b"}, "ports": [{"port": 80}]}})
    _slice_for(kube_api, "svc")
    core.delete_namespaced_service("svc", "serving")
    discovery = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    assert discovery.list_namespaced_endpoint_slice("serving").items == []
