"""What one reconcile does, free of kopf: read, plan (pure modules), write.

kopf handlers in `main` call these and turn the outcome into Events and retries.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from laps_agent.policy.classes import CLASSES
from laps_agent.policy.groups import GroupPlan, PodView, plan_groups
from laps_operator import metrics
from laps_operator.naming import GROUP_LABEL, ClusterRef, cluster_name_problem
from laps_operator.reconcile.apply import contains
from laps_operator.reconcile.apply_writes import Applied, ChildRefused, apply_all, delete_if_owned
from laps_operator.reconcile.kube import Kube, KubeError, Ref
from laps_operator.reconcile.observed import pods_by_role, prefill_pods, workload_events
from laps_operator.reconcile.writers import cluster_lock, cr_ref, retry_on_conflict
from laps_operator.reconcile.writers import forget as forget_writers
from laps_operator.reconcile.writers import patch_status as _patch_status
from laps_operator.render.builders import build_children, optional_children
from laps_operator.render.network_policy import network_policy_refs
from laps_operator.render.overrides import parse_checked_spec
from laps_operator.spec.cluster import ClusterSpec, InvalidSpecError
from laps_operator.spec.replicas import replicas_in_force
from laps_operator.status.conditions import (
    CHILD_REFUSED,
    INVALID_SPEC,
    condition,
    groups_status,
    invalid_status,
    now_rfc3339,
    reconciled_status,
    workload_readiness,
)

# Every function here that writes holds the cluster's lock (writers.cluster_lock) from its read
# of the live LAPSCluster to its last write; callers pass names, never a body that may be stale.


@dataclass
class Outcome:
    applied: list[Applied] = field(default_factory=list)
    plan: GroupPlan | None = None
    phase: str = ""
    previous_phase: str = ""
    invalid: str | None = None
    refused: str | None = None         # repairs the API server refused (the children left as they are)
    gone: bool = False                 # the cluster no longer exists (or is being deleted)
    cluster: dict[str, Any] | None = None   # the live object it reconciled (for Events)


def cluster_ref(body: dict[str, Any]) -> ClusterRef:
    meta = body["metadata"]
    return ClusterRef(meta["name"], meta.get("namespace") or "default", meta.get("uid") or "")


def parse_cluster(body: dict[str, Any]) -> ClusterSpec:
    """The typed spec of a LAPSCluster whose children can exist: its name must fit their names
    (naming.cluster_name_problem) and its spec must be valid; InvalidSpecError otherwise. With
    autoscaling on, its replica counts are the planner's (spec/replicas.py): every reader of
    the spec in force (the workloads, the group sync, readiness) sees the counts the pools run."""
    problem = cluster_name_problem(body["metadata"]["name"])
    if problem:
        raise InvalidSpecError(problem)
    return replicas_in_force(parse_checked_spec(body.get("spec")), body.get("status"))


def own_namespace() -> str | None:
    """The operator's namespace, from the downward API variable the chart sets."""
    return os.environ.get("POD_NAMESPACE") or None


def patch_status(kube: Kube, ref: ClusterRef, status: dict[str, Any],
                 resource_version: str | None = None) -> dict[str, Any] | None:
    return _patch_status(kube, ref.namespace, ref.name, status, resource_version)


def is_gone(live: dict[str, Any] | None, uid: str | None = None) -> bool:
    """Deleted, being deleted, or (with `uid`) another cluster of the same name: a writer
    working for an incarnation that was deleted and created again must not write into the new one."""
    if live is None:
        return True
    meta = live.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) or (uid is not None and (meta.get("uid") or "") != uid)


def reconcile(kube: Kube, namespace: str, name: str, *, skip_invalid: bool = False,
              uid: str | None = None) -> Outcome:
    """Bring the children of one LAPSCluster in line with its *live* spec and write its status.
    `skip_invalid`: leave a cluster its spec checks found invalid alone (the resync: nothing to
    repair until its spec changes, and that change gets a reconcile of its own); one whose
    children the API server refused is tried again (an admission policy may have been relaxed). `uid`: only that
    incarnation (the resync of a cluster since deleted finds it gone)."""
    with cluster_lock(namespace, name):
        return retry_on_conflict(lambda: _reconcile_live(kube, namespace, name, skip_invalid, uid))


def _reconcile_live(kube: Kube, namespace: str, name: str, skip_invalid: bool, uid: str | None) -> Outcome:
    live = kube.get(cr_ref(namespace, name))
    if is_gone(live, uid):
        return Outcome(gone=True)
    if skip_invalid and marked_invalid(live) and not _refused_by_the_server(live):
        return Outcome(phase="Invalid", previous_phase="Invalid", cluster=live)
    outcome = _reconcile(kube, live)
    outcome.cluster = live
    return outcome


def _reconcile(kube: Kube, body: dict[str, Any]) -> Outcome:
    ref = cluster_ref(body)
    generation = body["metadata"].get("generation")
    old_status = body.get("status") or {}
    outcome = Outcome(previous_phase=old_status.get("phase") or "")
    try:
        spec = parse_cluster(body)
    except InvalidSpecError as exc:
        # Nothing is created or changed for a spec we cannot fully honour.
        _mark_invalid(kube, ref, body, str(exc))
        outcome.invalid, outcome.phase = str(exc), "Invalid"
        return outcome

    try:
        # A generation applied before (a resync, an operator restart or upgrade) is not the
        # spec's fault when refused now: apply_all reports those writes and goes on.
        outcome.applied = apply_all(kube, build_children(ref, spec, own_namespace()),
                                    optional_kinds=frozenset({"PodMonitor"}), applied=_applied(old_status, generation))
    except ChildRefused as exc:
        # A spec problem our checks missed (or an admission policy's): said as an invalid spec,
        # and tried again each resync (a policy may be relaxed), not at once.
        _mark_invalid(kube, ref, body, str(exc), reason=CHILD_REFUSED)
        outcome.invalid, outcome.phase = str(exc), "Invalid"
        return outcome
    refused = [a.detail for a in outcome.applied if a.action == "refused"]
    outcome.refused = "; ".join(refused) or None
    for api_version, kind, name in optional_children(ref, spec):
        removed = delete_if_owned(kube, Ref(api_version, kind, ref.namespace, name), ref.uid)
        if removed:
            outcome.applied.append(removed)
    outcome.plan = sync_groups(kube, ref, spec)
    outcome.phase = refresh_status(kube, ref, spec, generation=generation)
    outcome.gone = not outcome.phase   # deleted (perhaps created again) while this ran
    return outcome


def _applied(status: dict[str, Any], generation: int | None) -> bool:
    return status.get("observedGeneration") == generation and status.get("phase") not in (None, "", "Invalid")


def marked_invalid(live: dict[str, Any]) -> bool:
    """Whether status says this very generation is invalid, to the operator's checks or the API
    server's: the children still run the last valid one, which only the cluster's reconcile may
    replace, so the group sync and the allocation loop leave this spec alone."""
    status = live.get("status") or {}
    return status.get("phase") == "Invalid" and status.get("observedGeneration") == live["metadata"].get("generation")


def spec_in_force(live: dict[str, Any]) -> ClusterSpec | None:
    """The spec the cluster's children run, parsed; None when this generation is invalid (to
    the parser, or marked so in status: see marked_invalid), which readers other than the
    cluster's reconcile (the group sync, the allocation loop, the status refresh) leave alone."""
    if marked_invalid(live):
        return None
    try:
        return parse_cluster(live)
    except InvalidSpecError:
        return None


def _refused_by_the_server(live: dict[str, Any]) -> bool:
    invalid = condition((live.get("status") or {}).get("conditions"), INVALID_SPEC)
    return bool(invalid and invalid.get("reason") == CHILD_REFUSED)


def _mark_invalid(kube: Kube, ref: ClusterRef, body: dict[str, Any], message: str,
                  reason: str = INVALID_SPEC) -> None:
    old_status = body.get("status") or {}
    status = invalid_status(old_status, generation=body["metadata"].get("generation"), message=message,
                            now=now_rfc3339(), reason=reason)
    if not contains(old_status, _without_times(status)):
        patch_status(kube, ref, status, body["metadata"].get("resourceVersion"))


def label_pod(kube: Kube, namespace: str, pod: str, group: str) -> None:
    kube.patch(Ref("v1", "Pod", namespace, pod), {"metadata": {"labels": {GROUP_LABEL: group}}})


def sync_groups(kube: Kube, ref: ClusterRef, spec: ClusterSpec) -> GroupPlan | None:
    """Plan group membership, record it in status, then label the pods that differ.

    Status is written before labels: if the operator dies in between, the next run finds the
    plan recorded and finishes the labelling instead of planning anew.
    """
    with cluster_lock(ref.namespace, ref.name):
        return retry_on_conflict(lambda: _sync_groups(kube, ref, spec))


def _sync_groups(kube: Kube, ref: ClusterRef, spec: ClusterSpec) -> GroupPlan | None:
    # Pods first, then the recording: every writer records a group before it labels a pod, so
    # the recording read second covers every label seen. The other order could plan from a
    # recording older than a label another operator process (two overlap while a drained node's
    # operator runs out its grace period) just wrote, and put its moved pod back.
    pods = prefill_pods(kube, ref)
    live = kube.get(cr_ref(ref.namespace, ref.name))
    if is_gone(live, ref.uid):
        return None
    return record_groups(kube, ref, spec, live, pods)[0]


def short_need(spec: ClusterSpec, live: dict[str, Any]) -> int | None:
    """The planner's short need (status.autoscaling.shortNeed) while it runs: new prefill pods
    join the short group until it has them (groups rule 4); None with autoscaling off."""
    if not spec.autoscaling.enabled:
        return None
    need = ((live.get("status") or {}).get("autoscaling") or {}).get("shortNeed")
    return need if isinstance(need, int) and not isinstance(need, bool) else None


def record_groups(kube: Kube, ref: ClusterRef, spec: ClusterSpec, live: dict[str, Any], pods: list[PodView],
                  *, read_before_pods: bool = False) -> tuple[GroupPlan, dict[str, Any]]:
    """The group sync on what the caller read (under the cluster's lock): plan membership from
    `pods` and the recording in `live`, record it in status, then label the pods that differ.
    Returns the plan and the live object after it: the status write's answer, or `live` itself
    when nothing needed writing.

    `read_before_pods`: `live` was read before `pods` were listed (the allocation step reads the
    cluster with its spec before the pressure, the pods after it), so a label another process
    wrote in between may be newer than the recording read. Every writer records a group before
    it labels a pod, so such a label changed the cluster's version: labels are then written only
    after a write conditional on `live`'s version (the status write) or, without one, a read
    that finds the version unchanged; otherwise a conflict (409) has the caller read afresh."""
    recorded = ((live.get("status") or {}).get("groups")) or {}
    alloc = spec.laps.allocation
    # minPerGroup is the allocation loop's floor; without the loop each group keeps one pod.
    plan = plan_groups(ref.prefill, spec.prefill.replicas, pods, recorded,
                       alloc.min_per_group if alloc.enabled else 1, short_need(spec, live))
    wanted = groups_status(plan.groups)
    if not contains(live.get("status") or {}, wanted):
        # Conditional: a membership computed from an older recording must not replace a newer one.
        live = patch_status(kube, ref, wanted, live["metadata"].get("resourceVersion")) or live
    elif read_before_pods and plan.label_changes:
        _still_at(kube, ref, live)
    for pod, group in sorted(plan.label_changes.items()):
        label_pod(kube, ref.namespace, pod, group)
    metrics.record_groups(ref.namespace, ref.name, ref.uid, plan.sizes)
    return plan, live


def _still_at(kube: Kube, ref: ClusterRef, live: dict[str, Any]) -> None:
    """KubeError 409 unless the cluster is still the version `live` is (nothing wrote it since)."""
    now = kube.get(cr_ref(ref.namespace, ref.name))
    version = (live.get("metadata") or {}).get("resourceVersion")
    if now is None or (now.get("metadata") or {}).get("resourceVersion") != version:
        raise KubeError(409, f"LAPSCluster {ref.namespace}/{ref.name} changed since it was read")


def refresh_status(kube: Kube, ref: ClusterRef, spec: ClusterSpec, *, generation: int | None) -> str:
    """Recompute readiness from the workloads (and, while not ready, their pods) and write status
    if it changed; returns the phase, "" when the cluster was deleted (or created again) meanwhile."""
    ns = ref.namespace
    with cluster_lock(ns, ref.name):
        prefill = kube.get(Ref("apps/v1", "StatefulSet", ns, ref.prefill))
        decode = kube.get(Ref("apps/v1", "Deployment", ns, ref.decode))
        gateway = kube.get(Ref("apps/v1", "Deployment", ns, ref.gateway))
        readiness = workload_readiness(spec, prefill, decode, gateway)
        if not readiness.ready or readiness.rollout:
            # Say why from the pods; a cluster that is ready and rolled out lists none. A
            # StatefulSet short of pods says why only in its Events (a Deployment: in status).
            short = prefill is not None and ((prefill.get("status") or {}).get("replicas") or 0) < spec.prefill.replicas
            events = {"prefill": workload_events(kube, prefill)} if short else None
            readiness = workload_readiness(spec, prefill, decode, gateway, pods_by_role(kube, ref), events)

        def write() -> str:
            live = kube.get(cr_ref(ns, ref.name))
            if is_gone(live, ref.uid or None):   # deleted meanwhile, perhaps created again
                return ""
            old_status = live.get("status") or {}
            status = reconciled_status(old_status, generation=generation, readiness=readiness, now=now_rfc3339())
            if not contains(old_status, _without_times(status)):
                patch_status(kube, ref, status, (live.get("metadata") or {}).get("resourceVersion"))
            return status["phase"]

        return retry_on_conflict(write)


def _live_valid(kube: Kube, namespace: str, name: str, uid: str | None = None
                ) -> tuple[dict[str, Any], ClusterSpec] | None:
    """The live cluster and its parsed spec; None when it is gone (or, with `uid`, another of
    its name) or its spec is invalid: to the parser, or to the API server (the Invalid phase of
    this very generation, which only the cluster's reconcile may clear)."""
    live = kube.get(cr_ref(namespace, name))
    if is_gone(live, uid):
        return None
    spec = spec_in_force(live)
    return None if spec is None else (live, spec)


def refresh_cluster(kube: Kube, namespace: str, name: str, uid: str | None = None) -> tuple[str, str] | None:
    """(old phase, new phase) after re-reading a cluster's workloads; None if it is gone/invalid."""
    with cluster_lock(namespace, name):
        found = _live_valid(kube, namespace, name, uid)
        if found is None:
            return None
        live, spec = found
        ref = cluster_ref(live)
        old_phase = (live.get("status") or {}).get("phase") or ""
        generation = (live.get("status") or {}).get("observedGeneration")
        return old_phase, refresh_status(kube, ref, spec, generation=generation)


def sync_groups_of(kube: Kube, namespace: str, name: str) -> tuple[dict[str, Any], GroupPlan] | None:
    """The group sync a pod event asks for, on the live cluster; None if gone or invalid (the
    cluster's own handler reports an invalid spec)."""
    with cluster_lock(namespace, name):
        live = kube.get(cr_ref(namespace, name))
        if is_gone(live):
            return None
        spec = spec_in_force(live)
        if spec is None:
            _restore_recorded_groups(kube, cluster_ref(live), (live.get("status") or {}).get("groups") or {})
            return None
        plan = sync_groups(kube, cluster_ref(live), spec)
        return (live, plan) if plan is not None else None


def _restore_recorded_groups(kube: Kube, ref: ClusterRef, recorded: dict[str, Any]) -> None:
    """An edit made the spec invalid: the children keep running as last reconciled, so a prefill
    pod recreated meanwhile (an eviction, a node drain) gets back the group recorded for it.
    Without its label it would sit in neither group's Service, serving nothing until the spec is
    fixed. Nothing is planned anew: the membership is the last valid spec's."""
    group_of = {pod: group for group in CLASSES for pod in recorded.get(group) or ()}
    for pod in prefill_pods(kube, ref):
        group = group_of.get(pod.name)
        if group and not pod.terminating and pod.group_label != group:
            label_pod(kube, ref.namespace, pod.name, group)


def delete_children(kube: Kube, ref: ClusterRef) -> list[Applied]:
    """Remove what the cluster owns. With a garbage collector the owner references would do it;
    doing it here as well makes deletion independent of one."""
    names = [
        ("apps/v1", "Deployment", ref.gateway), ("apps/v1", "Deployment", ref.decode),
        ("apps/v1", "StatefulSet", ref.prefill),
        ("v1", "Service", ref.gateway), ("v1", "Service", ref.decode),
        ("v1", "Service", ref.prefill_group_service("long")), ("v1", "Service", ref.prefill_group_service("short")),
        ("v1", "Service", ref.prefill),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", ref.gateway),
        ("rbac.authorization.k8s.io/v1", "Role", ref.gateway), ("v1", "ServiceAccount", ref.gateway),
        ("v1", "ConfigMap", ref.config), ("monitoring.coreos.com/v1", "PodMonitor", ref.name),
        *network_policy_refs(ref),
    ]
    removed = []
    for api_version, kind, name in names:
        done = delete_if_owned(kube, Ref(api_version, kind, ref.namespace, name), ref.uid)
        if done:
            removed.append(done)
    metrics.forget_cluster(ref.namespace, ref.name, ref.uid)
    forget_writers(ref.namespace, ref.name)
    return removed


def _without_times(status: dict[str, Any]) -> dict[str, Any]:
    """Status minus timestamps, to tell a real change from a re-computation."""
    out = dict(status)
    if "conditions" in out:
        out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in out["conditions"]]
    return out
