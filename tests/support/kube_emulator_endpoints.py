"""An opt-in stand-in for kube-controller-manager's EndpointSlice controller.

The emulator runs no controllers by default (tests act as them). Where a test wants the
operator -> Service -> gateway path to work end to end, this keeps one EndpointSlice per
selector-carrying Service in step with the Pods it selects, as the real controller does:
addresses from `status.podIP` (pods without one are left out), `ready`/`serving` from the
pod's Ready condition (or `publishNotReadyAddresses`), `terminating` from deletionTimestamp,
ports resolved from the Service's `targetPort` (numbers, or names looked up in the pod's
container ports), labelled `kubernetes.io/service-name` and owned by the Service.
"""
from __future__ import annotations

import kmock

from tests.support.kube_emulator_store import ObjectStore, ResourceRef, WatchEvent

PODS = kmock.resource("", "v1", "pods")
SERVICES = kmock.resource("", "v1", "services")
SLICES = kmock.resource("discovery.k8s.io", "v1", "endpointslices")
MANAGED_BY = "endpointslice-controller.k8s.io"


def _selects(selector: dict, pod: dict) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _target_port(service_port: dict, pods: list[dict]) -> int:
    target = service_port.get("targetPort", service_port["port"])
    if isinstance(target, int):
        return target
    for pod in pods:
        for container in (pod.get("spec") or {}).get("containers") or []:
            for port in container.get("ports") or []:
                if port.get("name") == target:
                    return port["containerPort"]
    return service_port["port"]


def desired_slice(service: dict, pods: list[dict]) -> dict:
    meta, spec = service["metadata"], service.get("spec") or {}
    publish_all = bool(spec.get("publishNotReadyAddresses"))
    endpoints = []
    for pod in pods:
        terminating = bool(pod["metadata"].get("deletionTimestamp"))
        ready = (publish_all or _ready(pod)) and not terminating
        endpoints.append({
            "addresses": [pod["status"]["podIP"]],
            "conditions": {"ready": ready, "serving": ready, "terminating": terminating},
            "targetRef": {"kind": "Pod", "name": pod["metadata"]["name"],
                          "namespace": pod["metadata"]["namespace"], "uid": pod["metadata"]["uid"]},
        })
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {
            "name": f"{meta['name']}-{meta['uid'][:5]}", "namespace": meta["namespace"],
            "labels": {"kubernetes.io/service-name": meta["name"],
                       "endpointslice.kubernetes.io/managed-by": MANAGED_BY},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "endpoints": endpoints,
        "ports": [{"name": p.get("name", ""), "port": _target_port(p, pods),
                   "protocol": p.get("protocol", "TCP")} for p in spec.get("ports") or []],
    }


class EndpointSliceController:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        store.after_commit.append(self._on_commit)

    def _on_commit(self, resource: ResourceRef, event: WatchEvent) -> None:
        if resource in (PODS, SERVICES):
            changed = event.new if event.new is not None else event.old
            self.reconcile(changed["metadata"]["namespace"])

    def reconcile(self, namespace: str | None = None) -> None:
        everything = lambda obj: True  # noqa: E731
        pods = self.store.list(PODS, namespace, everything)["items"]
        for service in self.store.list(SERVICES, namespace, everything)["items"]:
            selector = (service.get("spec") or {}).get("selector")
            if not selector:
                continue  # services without a selector have slices managed by their users
            ns = service["metadata"]["namespace"]
            chosen = [p for p in pods if p["metadata"]["namespace"] == ns and _selects(selector, p)
                      and (p.get("status") or {}).get("podIP")]
            wanted = desired_slice(service, chosen)
            name = wanted["metadata"]["name"]
            if self.store.find(SLICES, ns, name) is None:
                self.store.create(SLICES, ns, wanted)
            else:
                self.store.patch(SLICES, ns, name, lambda current, wanted=wanted: {
                    **current, "endpoints": wanted["endpoints"], "ports": wanted["ports"]},
                    status_only=False)
