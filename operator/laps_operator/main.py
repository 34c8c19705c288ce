"""kopf handlers: thin wrappers that call `reconcile`/`allocate` and turn outcomes into Events
and retries.

Run with `laps operator` (see `cli`). Handlers are sync functions: kopf runs them in worker
threads, where the official `kubernetes` client's blocking calls belong. The resync, the
allocation and the status loop run in threads of `workers` (started from the cluster watch below), not as kopf
timers: those would put a finalizer on every LAPSCluster (see workers.py). Every writer holds
the cluster's lock and works on the live object (see writers.py).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import kopf
import kubernetes

from laps_agent.policy.groups import GroupPlan
from laps_operator import metrics
from laps_operator.allocation.tick import AllocationLoop
from laps_operator.naming import CLUSTER_LABEL, GROUP, MANAGER, PLURAL, ROLE_LABEL, VERSION
from laps_operator.planner.tick import PlannerLoop
from laps_operator.reconcile import writers
from laps_operator.reconcile.cycle import cluster_ref, delete_children, reconcile, refresh_cluster, sync_groups_of
from laps_operator.reconcile.kube import Kube, KubeError
from laps_operator.reconcile.refusals import RepairRefusals
from laps_operator.reconcile.workers import ClusterLoops, Ticker

T = TypeVar("T")
MANAGED = {"app.kubernetes.io/managed-by": MANAGER}
RETRYABLE = {409, 429, 500, 502, 503, 504}
# How often every cluster is reconciled even without a change to it, so that a child deleted or
# edited by hand comes back. Environment, not a flag: read when this module is imported.
RESYNC_SECONDS = float(os.environ.get("LAPS_OPERATOR_RESYNC_SECONDS", "60"))
# The status loop runs when woken; this is only its longest sleep (the resync refreshes too).
IDLE_SECONDS = 3600.0
LOOPS = ClusterLoops()
REFUSALS = RepairRefusals()
log = logging.getLogger(__name__)


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
    # No handler needs one any more, so kopf removes this finalizer from clusters that an older
    # operator gave it, and adds it to none.
    settings.persistence.finalizer = "laps.io/operator"
    # No runtime scanning of namespaces and CRDs: it needs cluster-wide list/watch on both, which
    # an operator confined to some namespaces must not hold (least privilege; checked by the
    # least-privilege e2e test). The namespaces are fixed by the command line and the CRD is
    # installed with the chart before the operator starts.
    settings.scanning.disabled = True
    memo.kube = load_kube()


@kopf.on.cleanup()
def stop_loops(**_: Any) -> None:
    LOOPS.stop_all()


def _guarded(kube: Kube, namespace: str, name: str, fn: Callable[[], T]) -> T:
    """Run one writer; count its failure or success towards the WritesFailing condition."""
    try:
        result = fn()
    except KubeError as exc:
        if writers.record_failure(kube, namespace, name, exc):
            _event_on(kube, namespace, name, "Warning", "WritesFailing", str(exc)[:500])
        raise
    if writers.record_success(kube, namespace, name):
        _event_on(kube, namespace, name, "Normal", "WritesRecovered", "writes succeed again")
    return result


def _event_on(kube: Kube, namespace: str, name: str, type_: str, reason: str, message: str) -> None:
    live = kube.get(writers.cr_ref(namespace, name))
    if live is not None:
        kopf.event(live, type=type_, reason=reason, message=message)


def _retry_delay(exc: KubeError) -> float:
    # 403/422 and friends need someone to change RBAC or the spec: retry, but slowly (and log
    # it every 30 s, not every 2). A 404 is most often a race (a pod deleted while being moved).
    return 2.0 if exc.status in RETRYABLE or exc.status == 404 else 30.0


def _retry_or_raise(exc: KubeError) -> NoReturn:
    metrics.RECONCILES.labels(result="error").inc()
    said = "API server said" if _retry_delay(exc) < 30 else "API server rejected a write:"
    raise kopf.TemporaryError(f"{said} {exc}", delay=_retry_delay(exc)) from exc


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile_cluster(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        # The live object, read under the cluster's lock: never this (possibly older) body.
        outcome = _guarded(memo.kube, namespace, name, lambda: reconcile(memo.kube, namespace, name))
    except KubeError as exc:
        if exc.status == 404 and memo.kube.get(writers.cr_ref(namespace, name)) is None:
            return  # deleted while we wrote: nothing left to reconcile
        _retry_or_raise(exc)
    if outcome.gone:
        return
    LOOPS.wake(namespace, name, "allocation")   # a sleeping allocation loop sees the new spec now
    live = outcome.cluster or body
    if outcome.invalid is not None:
        metrics.RECONCILES.labels(result="invalid").inc()
        kopf.event(live, type="Warning", reason="InvalidSpec", message=outcome.invalid)
        raise kopf.PermanentError(f"invalid spec: {outcome.invalid}")
    metrics.RECONCILES.labels(result="error" if outcome.refused else "ok").inc()
    REFUSALS.report(namespace, name, outcome.refused, outcome.cluster)
    for action, reason in (("created", "Created"), ("patched", "Updated"), ("deleted", "Deleted")):
        names = [f"{a.ref.kind}/{a.ref.name}" for a in outcome.applied if a.action == action]
        if names:
            kopf.event(live, type="Normal", reason=reason, message=f"{action} " + ", ".join(names))
    for skipped in (a for a in outcome.applied if a.action == "skipped"):
        kopf.event(live, type="Warning", reason="Skipped",
                   message=f"{skipped.ref.kind}/{skipped.ref.name}: {skipped.detail}")
    _report_groups(live, outcome.plan)
    if outcome.phase != outcome.previous_phase:
        kopf.event(live, type="Normal", reason="Phase",
                   message=f"phase {outcome.previous_phase or 'none'} -> {outcome.phase}")
    logger.info("reconciled: phase %s", outcome.phase)


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def delete_cluster(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Optional: runs only when kopf sees the deletion (no finalizer waits for it). The owner
    references let the garbage collector remove the children either way."""
    meta = body["metadata"]
    LOOPS.stop(meta["namespace"], meta["name"], meta.get("uid") or "")
    try:
        removed = delete_children(memo.kube, cluster_ref(dict(body)))
    except KubeError as exc:
        _retry_or_raise(exc)
    logger.info("deleted %d children", len(removed))


@kopf.on.event(GROUP, VERSION, PLURAL)
def cluster_seen(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Start a cluster's resync, allocation and status loops when it appears, stop them when it goes."""
    meta = body.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if not namespace or not name or not hasattr(memo, "kube"):
        return
    uid = meta.get("uid") or ""
    if event.get("type") == "DELETED" or meta.get("deletionTimestamp"):
        # Loops first: a tick still under way then finds its incarnation stale before it writes
        # (the uid checks in reconcile/allocate, the incarnation check in metrics), so nothing
        # puts back the series removed here. Only this uid's: never a newer namesake's.
        LOOPS.stop(namespace, name, uid)
        metrics.forget_cluster(namespace, name, uid)
        writers.forget(namespace, name)
        REFUSALS.forget(namespace, name)
        return
    kube: Kube = memo.kube
    if LOOPS.ensure(namespace, name, uid, lambda: {
        "resync": Ticker(f"resync {namespace}/{name}", lambda: _resync(kube, namespace, name, uid), RESYNC_SECONDS),
        "allocation": Ticker(f"allocation {namespace}/{name}",
                             _allocation_tick(kube, AllocationLoop(kube, namespace, name, uid)), 0.0),
        "status": Ticker(f"status {namespace}/{name}", _status_tick(kube, namespace, name, uid), IDLE_SECONDS),
        "planner": Ticker(f"planner {namespace}/{name}",
                          _planner_tick(kube, PlannerLoop(kube, namespace, name, uid)), 0.0),
    }):
        metrics.start_cluster(namespace, name, uid)


def _resync(kube: Kube, namespace: str, name: str, uid: str) -> float | None:
    """Periodic reconcile of one incarnation: repairs drift; quiet unless it had to change something."""
    try:
        outcome = _guarded(kube, namespace, name,
                           lambda: reconcile(kube, namespace, name, skip_invalid=True, uid=uid))
    except KubeError as exc:
        metrics.RECONCILES.labels(result="error").inc()
        log.warning("resync of %s/%s failed: %s", namespace, name, exc)
        return min(RESYNC_SECONDS, 5.0)
    if outcome.gone or not LOOPS.current(namespace, name, uid):
        return None   # deleted meanwhile: no Event about it either
    if outcome.phase == "Invalid" and outcome.previous_phase == "Invalid" and not outcome.applied:
        return RESYNC_SECONDS   # reported when the spec changed; nothing to repair until it changes again
    metrics.RECONCILES.labels(result="invalid" if outcome.invalid else "error" if outcome.refused else "ok").inc()
    REFUSALS.report(namespace, name, outcome.refused, outcome.cluster)
    changed = [f"{a.ref.kind}/{a.ref.name}" for a in outcome.applied if a.action in ("created", "patched")]
    meta, status = outcome.cluster["metadata"], outcome.cluster.get("status") or {}
    if changed and (meta.get("generation") != status.get("observedGeneration") or outcome.previous_phase == "Invalid"):
        # A spec change the update handler has not reached yet, or one the API server refused
        # before (an admission policy since relaxed): the resync applied it.
        kopf.event(outcome.cluster, type="Normal", reason="Updated",
                   message=f"applied generation {meta.get('generation')}: " + ", ".join(changed))
    elif changed:
        kopf.event(outcome.cluster, type="Normal", reason="Repaired", message="restored " + ", ".join(changed))
        log.info("resync of %s/%s restored %s", namespace, name, ", ".join(changed))
    _report_groups(outcome.cluster, outcome.plan)
    return RESYNC_SECONDS


def _status_tick(kube: Kube, namespace: str, name: str, uid: str) -> Callable[[], float | None]:
    """The Ready/Progressing conditions again, when a workload or pod event wakes it: on its
    own thread, so a burst of pod events (a rollout, an operator restart) is one refresh in
    progress and one pending per cluster, never kopf's worker threads queued on its lock."""
    def tick() -> float | None:
        try:
            phases = refresh_cluster(kube, namespace, name, uid=uid)
        except KubeError as exc:
            log.warning("status refresh of %s/%s failed: %s", namespace, name, exc)
            return _retry_delay(exc)   # an event handler is never retried: this loop is
        if not LOOPS.current(namespace, name, uid):
            return None
        if phases and phases[1] and phases[0] != phases[1]:   # "": gone meanwhile, no Event
            _event_on(kube, namespace, name, "Normal", "Phase", f"phase {phases[0] or 'none'} -> {phases[1]}")
        return IDLE_SECONDS
    return tick


def _allocation_tick(kube: Kube, loop: AllocationLoop) -> Callable[[], float | None]:
    def tick() -> float | None:
        try:
            delay, outcome = _guarded(kube, loop.namespace, loop.name, loop.tick)
        except KubeError as exc:
            log.warning("allocation step of %s/%s failed: %s", loop.namespace, loop.name, exc)
            return _retry_delay(exc)
        if not LOOPS.current(loop.namespace, loop.name, loop.uid):
            return None   # deleted while this tick ran: no Event about it
        if outcome is None or outcome.cluster is None:
            return delay
        live, move, reading = outcome.cluster, outcome.move, outcome.reading
        if move is not None:
            kopf.event(live, type="Normal", reason="Rebalanced",
                       message=f"pod {move.pod} moved {move.source} -> {move.target}: {outcome.reason}")
            log.info("%s/%s: moved %s %s -> %s (%s)", loop.namespace, loop.name, move.pod, move.source,
                     move.target, outcome.reason)
        if outcome.became_unavailable and reading is not None:
            kopf.event(live, type="Warning", reason="PressureUnavailable", message=reading.message[:500])
        if outcome.recovered:
            kopf.event(live, type="Normal", reason="PressureRecovered", message="pressure is known again")
        return delay
    return tick


def _planner_tick(kube: Kube, loop: PlannerLoop) -> Callable[[], float | None]:
    """The planner's step, then, when it changed the counts, a reconcile that applies them (the
    workloads' replicas are the planner's while autoscaling is on: spec/replicas.py)."""
    def tick() -> float | None:
        try:
            delay, outcome = _guarded(kube, loop.namespace, loop.name, loop.tick)
            if outcome is not None and outcome.changed:
                _guarded(kube, loop.namespace, loop.name,
                         lambda: reconcile(kube, loop.namespace, loop.name, skip_invalid=True, uid=loop.uid))
        except KubeError as exc:
            log.warning("planner step of %s/%s failed: %s", loop.namespace, loop.name, exc)
            return _retry_delay(exc)
        if not LOOPS.current(loop.namespace, loop.name, loop.uid):
            return None
        if outcome is None or outcome.cluster is None or outcome.decision is None:
            return delay
        live, decision = outcome.cluster, outcome.decision
        if outcome.changed:
            kopf.event(live, type="Normal", reason="Scaled", message=decision.reason[:500])
            log.info("%s/%s: %s", loop.namespace, loop.name, decision.reason)
        if outcome.became_frozen:
            kopf.event(live, type="Warning", reason="AutoscalingFrozen", message=decision.reason[:500])
        if outcome.resumed:
            kopf.event(live, type="Normal", reason="AutoscalingResumed", message="the planner has what it needs again")
        return delay
    return tick


@kopf.on.event("v1", "pods", labels={ROLE_LABEL: "prefill", **MANAGED})
def prefill_pod_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Give each prefill pod its group as soon as it appears (or loses its label)."""
    if event.get("type") == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
        return
    cluster, namespace = body["metadata"]["labels"].get(CLUSTER_LABEL), body["metadata"].get("namespace")
    if not cluster or not namespace or not hasattr(memo, "kube"):
        return
    try:
        synced = _guarded(memo.kube, namespace, cluster, lambda: sync_groups_of(memo.kube, namespace, cluster))
    except KubeError as exc:
        if exc.status in RETRYABLE:
            raise kopf.TemporaryError(f"API server said {exc}", delay=1) from exc
        raise
    if synced is not None:
        _report_groups(synced[0], synced[1])


@kopf.on.event("apps/v1", "statefulsets", labels=MANAGED)
@kopf.on.event("apps/v1", "deployments", labels=MANAGED)
@kopf.on.event("v1", "pods", labels=MANAGED)
def child_changed(body: kopf.Body, **_: Any) -> None:
    """Follow the workloads' ready replicas, and every role's pods (a pod in CrashLoopBackOff
    or that cannot pull its image changes no workload's status), into the cluster's Ready and
    Progressing conditions: wakes the cluster's status loop. A deleted one too, so that what it
    said goes with it."""
    meta = body.get("metadata") or {}
    cluster, namespace = (meta.get("labels") or {}).get(CLUSTER_LABEL), meta.get("namespace")
    if cluster and namespace:
        LOOPS.wake(namespace, cluster, "status")


def _report_groups(cluster_body: Any, plan: GroupPlan | None) -> None:
    if plan is None or cluster_body is None:
        return
    for pod, group in sorted(plan.label_changes.items()):
        kopf.event(cluster_body, type="Normal", reason="GroupAssigned", message=f"pod {pod} -> {group}")
    for pod, (old, new) in sorted(plan.moved.items()):
        kopf.event(cluster_body, type="Normal", reason="GroupRebalanced",
                   message=f"pod {pod} moved {old} -> {new} so that each group keeps its minimum of pods")
