"""One writer at a time per LAPSCluster, conflict retries, and the WritesFailing condition.

Three kinds of writers touch a cluster: kopf's create/update/resume handler and the pod and
workload event handlers (kopf worker threads), the resync loop and the allocation loop (threads
of `workers`). Each holds its cluster's lock across read-decide-write and re-reads the live
LAPSCluster under it, never trusting a body that may be older than the last write: that is what
keeps a resync that started with an old spec from reverting a spec change, and a group sync from
reverting a move. The allocation step alone decides on the read its tick made just before it
(the one read per tick), but only writes conditionally on that read's version, and reads afresh
after a conflict (allocation/tick.py). Writes of status that others may also write carry the resourceVersion they
were computed from, so a writer outside this process (a second operator, `kubectl edit`) makes
them fail with 409 and be recomputed instead of being silently overwritten.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from laps_operator.naming import API_VERSION, KIND
from laps_operator.reconcile.kube import Kube, KubeError, Ref
from laps_operator.status.conditions import condition, now_rfc3339, set_condition

T = TypeVar("T")
log = logging.getLogger(__name__)

WRITES_FAILING = "WritesFailing"
# Consecutive failed reconciles/steps of one cluster before the condition says so: one failure
# is usually a blip (a conflict, an API server restart) that the next retry absorbs.
FAILURES_BEFORE_CONDITION = 3
CONFLICT_ATTEMPTS = 4

_guard = threading.Lock()
_locks: dict[tuple[str, str], threading.RLock] = {}
_failures: dict[tuple[str, str], int] = {}
_flagged: dict[tuple[str, str], bool | None] = {}   # None: unknown since start (check live status)


def cluster_lock(namespace: str, name: str) -> threading.RLock:
    """The cluster's lock. Re-entrant: a reconcile calls the group sync, which takes it too."""
    with _guard:
        return _locks.setdefault((namespace, name), threading.RLock())


def forget(namespace: str, name: str) -> None:
    with _guard:
        _locks.pop((namespace, name), None)
        _failures.pop((namespace, name), None)
        _flagged.pop((namespace, name), None)


def cr_ref(namespace: str, name: str) -> Ref:
    return Ref(API_VERSION, KIND, namespace, name)


def patch_status(kube: Kube, namespace: str, name: str, status: dict[str, Any],
                 resource_version: str | None = None) -> dict[str, Any] | None:
    """Merge-patch status; with `resource_version`, only if the object is still that version.
    Returns the object as written (the API server's answer)."""
    body: dict[str, Any] = {"status": status}
    if resource_version:
        body["metadata"] = {"resourceVersion": resource_version}
    return kube.patch(cr_ref(namespace, name), body, subresource="status")


def retry_on_conflict(fn: Callable[[], T], attempts: int = CONFLICT_ATTEMPTS) -> T:
    """Run `fn` (which re-reads what it writes) again while it fails with 409 Conflict."""
    for attempt in range(attempts):
        try:
            return fn()
        except KubeError as exc:
            if exc.status != 409 or attempt == attempts - 1:
                raise
            log.debug("conflict, recomputing (%d/%d): %s", attempt + 1, attempts, exc)
    raise AssertionError("unreachable")


def record_failure(kube: Kube, namespace: str, name: str, error: Exception) -> bool:
    """Count a failed write; True when this failure set the WritesFailing condition."""
    key = (namespace, name)
    with _guard:
        _failures[key] = count = _failures.get(key, 0) + 1
    if count < FAILURES_BEFORE_CONDITION or _flagged.get(key):
        return False
    message = f"{count} consecutive reconciles or allocation steps failed; the last: {error}"[:1000]
    if _set_condition(kube, namespace, name, True, "WriteFailures", message):
        _flagged[key] = True
        return True
    return False


def record_success(kube: Kube, namespace: str, name: str) -> bool:
    """Reset the count; True when this success cleared a WritesFailing condition."""
    key = (namespace, name)
    with _guard:
        _failures[key] = 0
        flagged = _flagged.get(key)
    if flagged is False:
        return False
    # None: this process has not looked yet; a previous operator may have left the condition.
    if flagged is None:
        live = kube.get(cr_ref(namespace, name)) or {}
        cond = condition((live.get("status") or {}).get("conditions"), WRITES_FAILING)
        if not cond or cond.get("status") != "True":
            _flagged[key] = False
            return False
    if _set_condition(kube, namespace, name, False, "Recovered", "writes succeed again"):
        _flagged[key] = False
        return True
    return False


def _set_condition(kube: Kube, namespace: str, name: str, value: bool, reason: str, message: str) -> bool:
    """Best effort: when writes fail, this one may fail too (then the next attempt tries again)."""
    try:
        with cluster_lock(namespace, name):
            live = kube.get(cr_ref(namespace, name))
            if live is None:
                return False
            status = live.get("status") or {}
            conditions = set_condition(status.get("conditions"), WRITES_FAILING, value, reason, message,
                                       generation=None, now=now_rfc3339())
            patch_status(kube, namespace, name, {"conditions": conditions},
                         live["metadata"].get("resourceVersion"))
        return True
    except KubeError as exc:
        log.warning("could not write the %s condition of %s/%s: %s", WRITES_FAILING, namespace, name, exc)
        return False
