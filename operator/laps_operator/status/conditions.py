"""The LAPSCluster's status (pure): phase, conditions, readiness of the children, groups."""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from laps_agent.policy.classes import CLASSES
from laps_operator.spec.cluster import ClusterSpec
from laps_operator.status.pod_problems import role_problems

READY, PROGRESSING, INVALID_SPEC = "Ready", "Progressing", "InvalidSpec"
CHILD_REFUSED = "ChildRefused"   # the InvalidSpec reason when the API server refuses a child


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str, status: bool, reason: str,
                  message: str, *, generation: int | None, now: str) -> list[dict[str, Any]]:
    """Conditions with `type_` set; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    out = [dict(c) for c in conditions or () if c.get("type") != type_]
    old = next((c for c in conditions or () if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == value else now
    new = {"type": type_, "status": value, "reason": reason, "message": message, "lastTransitionTime": since}
    if generation is not None:
        new["observedGeneration"] = generation
    out.append(new)
    order = {READY: 0, PROGRESSING: 1, INVALID_SPEC: 2}
    return sorted(out, key=lambda c: (order.get(c["type"], 9), c["type"]))


def condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    message: str
    rollout: str = ""    # what is still rolling out ("" when every workload runs its template)


def _count(obj: Mapping[str, Any] | None, field: str) -> int:
    return int(((obj or {}).get("status") or {}).get(field) or 0)


def _rolling(name: str, obj: Mapping[str, Any], want: int) -> str | None:
    """Why a workload has not finished rolling out its current template, as `kubectl rollout
    status` decides it; None when it has. Old pods keep their readiness while new ones start
    (a Deployment surges), so ready replicas alone call a stuck rollout (a bad image) done."""
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and observed is not None and observed < generation:
        return f"{name} update not yet seen by its controller"
    updated = _count(obj, "updatedReplicas")   # omitted by the API server when 0
    if updated < want:
        return f"{name} {updated}/{want} updated"
    if _count(obj, "replicas") > updated:
        return f"{name} {_count(obj, 'replicas') - updated} old pods still running"
    return None


def workload_readiness(spec: ClusterSpec, prefill: Mapping | None, decode: Mapping | None,
                       gateway: Mapping | None, pods: Mapping[str, Sequence[Mapping]] | None = None,
                       events: Mapping[str, Sequence[Mapping]] | None = None) -> Readiness:
    """Ready when every workload has as many ready replicas as the spec asks for; the rollout
    is done when, besides, every replica runs the workload's current template. `pods`: each
    role's pods, when known: a role not ready or still rolling out says why in brackets
    (pod_problems.role_problems); `events`: a role's workload Events, where read."""
    wanted = [("prefill", prefill, spec.prefill.replicas, "StatefulSet"),
              ("decode", decode, spec.decode.replicas, "Deployment"),
              ("gateway", gateway, spec.gateway.replicas, "Deployment")]

    def why(name: str, obj: Mapping | None, kind: str, want: int) -> str:
        said = role_problems(pods.get(name, ()), obj, kind, want, (events or {}).get(name, ())) if pods is not None else ""
        return f" [{said}]" if said else ""

    waiting = [f"{name} {_count(obj, 'readyReplicas')}/{want}{why(name, obj, kind, want)}"
               for name, obj, want, kind in wanted if obj is None or _count(obj, "readyReplicas") < want]
    # Said in both conditions: each stands alone (a stuck rollout behind ready old pods is
    # Progressing's alone; a first start is both).
    rolling = [r + why(name, obj, kind, want) for name, obj, want, kind in wanted
               if obj is not None and (r := _rolling(name, obj, want))]
    rollout = "rolling out: " + ", ".join(rolling) if rolling else ""
    if waiting:
        return Readiness(False, "waiting for ready replicas: " + ", ".join(waiting), rollout)
    return Readiness(True, "all prefill, decode and gateway replicas are ready", rollout)


def reconciled_status(old: Mapping[str, Any] | None, *, generation: int | None, readiness: Readiness,
                      now: str) -> dict[str, Any]:
    """Phase and conditions after a successful reconcile of a valid spec. Group membership is
    not part of it: only the group sync writes that, so a concurrent readiness update can never
    put back a stale membership."""
    conditions = (old or {}).get("conditions")
    conditions = set_condition(conditions, INVALID_SPEC, False, "Valid", "spec is valid", generation=generation, now=now)
    conditions = set_condition(conditions, READY, readiness.ready, "AllReplicasReady" if readiness.ready else "NotReady",
                               readiness.message, generation=generation, now=now)
    # Ready says whether the cluster serves; Progressing (and the phase) whether it serves what
    # the spec now asks for: after an edit, old pods keep serving while the new ones roll out.
    done = readiness.ready and not readiness.rollout
    conditions = set_condition(conditions, PROGRESSING, not done, "Complete" if done else "RollingOut",
                               "children are up to date" if done else readiness.rollout or readiness.message,
                               generation=generation, now=now)
    status: dict[str, Any] = {"phase": "Ready" if done else "Progressing", "conditions": conditions}
    if generation is not None:  # a readiness-only refresh does not know which spec it reflects
        status["observedGeneration"] = generation
    return status


def groups_status(groups: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    return {
        "groups": {g: list(groups.get(g, ())) for g in CLASSES},
        "groupSizes": {g: len(groups.get(g, ())) for g in CLASSES},
    }


def invalid_status(old: Mapping[str, Any] | None, *, generation: int | None, message: str, now: str,
                   reason: str = INVALID_SPEC) -> dict[str, Any]:
    """`reason`: InvalidSpec (the operator's own checks) or CHILD_REFUSED (the API server's or
    an admission policy's, retried every resync: a policy may be relaxed)."""
    conditions = (old or {}).get("conditions")
    conditions = set_condition(conditions, INVALID_SPEC, True, reason, message, generation=generation, now=now)
    conditions = set_condition(conditions, READY, False, reason, message, generation=generation, now=now)
    conditions = set_condition(conditions, PROGRESSING, False, reason, "fix the spec to continue",
                               generation=generation, now=now)
    return {"phase": "Invalid", "observedGeneration": generation, "conditions": conditions}
