"""What the operator reads of a cluster besides its own children: its pods, and the Events of a
workload that cannot create them."""
from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from laps_agent.policy.groups import PodView
from laps_operator.naming import CLUSTER_LABEL, GROUP_LABEL, ROLE_LABEL, ClusterRef, role_selector
from laps_operator.reconcile.kube import Kube, KubeError, Ref
from laps_operator.status.pod_problems import pod_ready

log = logging.getLogger(__name__)


def prefill_pods(kube: Kube, ref: ClusterRef) -> list[PodView]:
    pods = kube.list(Ref("v1", "Pod", ref.namespace), role_selector(ref.name, "prefill"))
    return [
        PodView(
            name=p["metadata"]["name"],
            group_label=(p["metadata"].get("labels") or {}).get(GROUP_LABEL),
            terminating=bool(p["metadata"].get("deletionTimestamp")),
            ready=pod_ready(p),
        )
        for p in pods
    ]


def pods_by_role(kube: Kube, ref: ClusterRef) -> dict[str, list[dict[str, Any]]]:
    """Every pod of the cluster, in one list call, by its role label."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in kube.list(Ref("v1", "Pod", ref.namespace), {CLUSTER_LABEL: ref.name}):
        out.setdefault((pod["metadata"].get("labels") or {}).get(ROLE_LABEL) or "", []).append(pod)
    return out


def workload_events(kube: Kube, workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Events of one workload object (this uid: not a deleted namesake's). [] when they
    cannot be read: they only add a reason to the status, which must not fail for them (an
    operator upgraded without its chart's RBAC for listing Events, say)."""
    meta = workload.get("metadata") or {}
    about = {"involvedObject.kind": str(workload.get("kind") or ""), "involvedObject.name": str(meta.get("name"))}
    if meta.get("uid"):
        about["involvedObject.uid"] = str(meta["uid"])
    try:
        return kube.list(Ref("v1", "Event", meta.get("namespace") or ""), field_selector=about)
    except KubeError as exc:
        if exc.status == 403 and _FORBIDDEN_SAID.is_set():
            return []   # RBAC does not change by itself: said once, not at every status refresh
        if exc.status == 403:
            _FORBIDDEN_SAID.set()
        log.warning("cannot read the Events of %s/%s: %s", workload.get("kind"), meta.get("name"), exc)
        return []


_FORBIDDEN_SAID = threading.Event()
