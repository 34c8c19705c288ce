"""kopf handlers: thin wrappers that call `reconcile` and turn outcomes into Events and retries.

Run with `laps operator` (see `cli`). Handlers are sync functions: kopf runs them in worker
threads, where the official `kubernetes` client's blocking calls belong.
"""
from __future__ import annotations

import logging
import os
from typing import Any, NoReturn

import kopf
import kubernetes

from . import metrics
from .groups import GroupPlan
from .kube import Kube, KubeError
from .naming import CLUSTER_LABEL, MANAGER, ROLE_LABEL
from .reconcile import cluster_ref, cr_ref, delete_children, reconcile, refresh_cluster, sync_groups
from .spec import GROUP, PLURAL, VERSION, InvalidSpecError, parse_spec

MANAGED = {"app.kubernetes.io/managed-by": MANAGER}
RETRYABLE = {409, 429, 500, 502, 503, 504}
# How often every cluster is reconciled even without a change to it, so that a child deleted or
# edited by hand comes back. Environment, not a flag: kopf reads it when this module is imported.
RESYNC_SECONDS = float(os.environ.get("LAPS_OPERATOR_RESYNC_SECONDS", "60"))


def load_kube() -> Kube:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        # Read $KUBECONFIG now, not the value the client captured when it was imported.
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
    return Kube(kubernetes.client.ApiClient())


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations: status belongs to the CRD's schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="laps.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="laps.io", key="last-handled-configuration")
    settings.posting.reporting_component = MANAGER
    settings.posting.level = logging.INFO
    settings.persistence.finalizer = "laps.io/operator"
    memo.kube = load_kube()


def _retry_or_raise(exc: KubeError) -> NoReturn:
    metrics.RECONCILES.labels(result="error").inc()
    if exc.status in RETRYABLE:
        raise kopf.TemporaryError(f"API server said {exc}", delay=2) from exc
    # 403/422 and friends need someone to change RBAC or the spec: retry, but slowly.
    raise kopf.TemporaryError(f"API server rejected a write: {exc}", delay=30) from exc


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile_cluster(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    try:
        outcome = reconcile(memo.kube, dict(body))
    except KubeError as exc:
        _retry_or_raise(exc)
    if outcome.invalid is not None:
        metrics.RECONCILES.labels(result="invalid").inc()
        kopf.event(body, type="Warning", reason="InvalidSpec", message=outcome.invalid)
        raise kopf.PermanentError(f"invalid spec: {outcome.invalid}")
    metrics.RECONCILES.labels(result="ok").inc()
    for action, reason in (("created", "Created"), ("patched", "Updated"), ("deleted", "Deleted")):
        names = [f"{a.ref.kind}/{a.ref.name}" for a in outcome.applied if a.action == action]
        if names:
            kopf.event(body, type="Normal", reason=reason, message=f"{action} " + ", ".join(names))
    for skipped in (a for a in outcome.applied if a.action == "skipped"):
        kopf.event(body, type="Warning", reason="Skipped",
                   message=f"{skipped.ref.kind}/{skipped.ref.name}: {skipped.detail}")
    _report_groups(body, outcome.plan)
    if outcome.phase != outcome.previous_phase:
        kopf.event(body, type="Normal", reason="Phase",
                   message=f"phase {outcome.previous_phase or 'none'} -> {outcome.phase}")
    logger.info("reconciled: phase %s", outcome.phase)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync_cluster(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Periodic reconcile: repairs drift; quiet unless it had to change something."""
    if (body.get("status") or {}).get("phase") == "Invalid":
        return  # reported when the spec changed; nothing to repair until it changes again
    try:
        outcome = reconcile(memo.kube, dict(body))
    except KubeError as exc:
        _retry_or_raise(exc)
    metrics.RECONCILES.labels(result="invalid" if outcome.invalid else "ok").inc()
    repaired = [f"{a.ref.kind}/{a.ref.name}" for a in outcome.applied if a.action in ("created", "patched")]
    if repaired:
        kopf.event(body, type="Normal", reason="Repaired", message="restored " + ", ".join(repaired))
        logger.info("resync restored %s", ", ".join(repaired))
    _report_groups(body, outcome.plan)


@kopf.on.delete(GROUP, VERSION, PLURAL)
def delete_cluster(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    try:
        removed = delete_children(memo.kube, cluster_ref(dict(body)))
    except KubeError as exc:
        _retry_or_raise(exc)
    logger.info("deleted %d children", len(removed))


@kopf.on.event("v1", "pods", labels={ROLE_LABEL: "prefill", **MANAGED})
def prefill_pod_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Give each prefill pod its group as soon as it appears (or loses its label)."""
    if event.get("type") == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
        return
    cluster, namespace = body["metadata"]["labels"].get(CLUSTER_LABEL), body["metadata"].get("namespace")
    if not cluster or not namespace or not hasattr(memo, "kube"):
        return
    kube: Kube = memo.kube
    try:
        live = kube.get(cr_ref(namespace, cluster))
        if live is None:
            return
        try:
            spec = parse_spec(live.get("spec"))
        except InvalidSpecError:
            return  # the cluster's own handler reports this
        plan = sync_groups(kube, cluster_ref(live), spec)
    except KubeError as exc:
        if exc.status in RETRYABLE:
            raise kopf.TemporaryError(f"API server said {exc}", delay=1) from exc
        raise
    _report_groups(live, plan)


@kopf.on.event("apps/v1", "statefulsets", labels=MANAGED)
@kopf.on.event("apps/v1", "deployments", labels=MANAGED)
def workload_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Follow the workloads' ready replicas into the cluster's Ready condition and phase."""
    cluster, namespace = (body["metadata"].get("labels") or {}).get(CLUSTER_LABEL), body["metadata"].get("namespace")
    if not cluster or not namespace or not hasattr(memo, "kube") or event.get("type") == "DELETED":
        return
    try:
        phases = refresh_cluster(memo.kube, namespace, cluster)
    except KubeError as exc:
        if exc.status in RETRYABLE:
            raise kopf.TemporaryError(f"API server said {exc}", delay=1) from exc
        raise
    if phases and phases[0] != phases[1]:
        live = memo.kube.get(cr_ref(namespace, cluster))
        if live is not None:
            kopf.event(live, type="Normal", reason="Phase", message=f"phase {phases[0] or 'none'} -> {phases[1]}")


def _report_groups(cluster_body: Any, plan: GroupPlan | None) -> None:
    if plan is None:
        return
    for pod, group in sorted(plan.label_changes.items()):
        kopf.event(cluster_body, type="Normal", reason="GroupAssigned", message=f"pod {pod} -> {group}")
    for pod, (old, new) in sorted(plan.moved.items()):
        kopf.event(cluster_body, type="Normal", reason="GroupRebalanced",
                   message=f"pod {pod} moved {old} -> {new} so that each group keeps a pod")


# The allocation loop (pressure from Prometheus -> at most one move per interval) belongs here as
# a kopf timer on LAPSCluster once it exists: it will call a pure policy, then `sync_groups`-style
# actuation through status + labels, and bump metrics.REBALANCES / metrics.PRESSURE.
