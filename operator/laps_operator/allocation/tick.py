"""The allocation loop's step, free of kopf: pressure in, at most one move out.

Each tick reads the LAPSCluster and parses its spec once (`AllocationLoop.tick`: is the loop on,
is a decision due, where does the pressure come from). A due tick reads the pressure outside the
cluster's lock (a slow Prometheus must not hold up the other writers); then `step`, under the
lock, lists the prefill pods once (group sync, serving pods), asks `allocation.decide` and writes:
1. status: the pressure, the policy's memory (status.allocation.policy: a restarted operator
   keeps the cooldowns and the last move's direction; a move wanted but not yet confirmed is
   wanted afresh, see `consecutive`), the decision, the PressureUnavailable condition and, for a
   move, status.groups (which gives a recreated pod its group back), the bounded history and
   lastRebalanceTime;
2. then the moved pod's `laps.io/prefill-group` label. Status first, as in the group sync: if
   the operator dies in between, the next group sync finds the move recorded and labels the pod.
Both on the cluster as the tick read it, which may be older than the lock: every write is
conditional on that resourceVersion (labels follow such a write, or a check that it is
unchanged: cycle.record_groups), so a change meanwhile (another writer, the cluster deleted or
created again) is a conflict and the step decides again on a fresh read. The moved pod finishes
what it holds (its engine keeps scheduling it); the gateway stops sending it work of its old
class once the EndpointSlices follow the label.
"""
from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from laps_agent.policy.allocation import AllocationConfig, Decision, Move, PolicyState, decide
from laps_agent.policy.classes import CLASSES
from laps_operator import metrics
from laps_operator.allocation import pressure
from laps_operator.naming import GATEWAY_PORT, ClusterRef
from laps_operator.reconcile.apply import contains
from laps_operator.reconcile.cycle import cluster_ref, is_gone, label_pod, record_groups, spec_in_force
from laps_operator.reconcile.kube import Kube, KubeError
from laps_operator.reconcile.observed import prefill_pods
from laps_operator.reconcile.writers import cluster_lock, cr_ref, patch_status, retry_on_conflict
from laps_operator.spec.cluster import ClusterSpec
from laps_operator.spec.status import HISTORY  # the CRD's status.allocation.history maxItems
from laps_operator.status.conditions import condition, groups_status, set_condition

PRESSURE_UNAVAILABLE = "PressureUnavailable"
OFF_RECHECK_S = 10.0     # how often a loop that is off looks again (a spec change wakes it sooner)
SAMPLE_S = 1.0           # fallback mode: one gateway sample per second, averaged per interval
OFF_DECISION = "allocation is off"


def config_of(spec: ClusterSpec) -> AllocationConfig:
    alloc = spec.laps.allocation
    return AllocationConfig(ratio=alloc.ratio, min_per_group=alloc.min_per_group,
                            confirm=alloc.confirm_intervals, pod_cooldown_s=alloc.cooldown_seconds)


def active(spec: ClusterSpec) -> bool:
    return spec.laps.allocation.enabled and spec.prefill.replicas >= 2


def state_from_status(status: Mapping[str, Any] | None) -> PolicyState:
    raw = ((status or {}).get("allocation") or {}).get("policy") or {}
    moved = {str(k): float(v) for k, v in (raw.get("movedAt") or {}).items() if isinstance(v, (int, float))}
    return PolicyState(wanted=raw.get("wanted"), streak=int(raw.get("streak") or 0), moved_at=moved,
                       last_direction=raw.get("lastDirection"))


def state_to_status(state: PolicyState) -> dict[str, Any]:
    return {"wanted": state.wanted, "streak": state.streak, "lastDirection": state.last_direction,
            "movedAt": {pod: round(t, 3) for pod, t in sorted(state.moved_at.items())}}


def rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _round(value: float) -> float:
    return round(float(value), 3)


def allocation_status(old: Mapping[str, Any] | None, groups: Mapping[str, list[str]], reading: pressure.Reading,
                      decision: Decision, now: float) -> dict[str, Any]:
    """The status after one decision (pure). `groups` is the membership the decision saw."""
    old = old or {}
    stamp = rfc3339(now)
    allocation: dict[str, Any] = {"policy": state_to_status(decision.state),
                                  "lastDecision": decision.reason if reading.known
                                  else f"pressure unknown: {reading.message}"}
    status: dict[str, Any] = {"allocation": allocation}
    if reading.known:
        status["pressure"] = {**{g: _round(reading.totals[g]) for g in CLASSES}, "source": reading.source,
                              "perPod": {g: _round(v) for g, v in (decision.per_pod or {}).items()} or None}
        was = condition(old.get("conditions"), PRESSURE_UNAVAILABLE)
        # Written when absent, True, or left by a loop that was off (AllocationOff: it would
        # say "the allocation loop is off" while the loop ran and moved pods).
        if was is None or was.get("status") == "True" or was.get("reason") == "AllocationOff":
            reason, message = (("Recovered", "pressure is known again") if was and was.get("status") == "True"
                               else ("PressureKnown", "pressure is known"))
            status["conditions"] = set_condition(old.get("conditions"), PRESSURE_UNAVAILABLE, False, reason, message,
                                                 generation=None, now=stamp)
    else:
        status["pressure"] = {"short": None, "long": None, "perPod": None, "source": reading.source}
        status["conditions"] = set_condition(old.get("conditions"), PRESSURE_UNAVAILABLE, True, reading.reason,
                                             reading.message, generation=None, now=stamp)
    move = decision.move
    if move is not None:
        moved = {g: [p for p in groups.get(g, ()) if p != move.pod] for g in CLASSES}
        moved[move.target].append(move.pod)
        status.update(groups_status({g: sorted(moved[g], key=_ordinal_key) for g in CLASSES}))
        status["lastRebalanceTime"] = stamp
        history = list((old.get("allocation") or {}).get("history") or [])
        history.append({"time": stamp, "pod": move.pod, "from": move.source, "to": move.target,
                        "reason": decision.reason})
        allocation["history"] = history[-HISTORY:]
    return status


def _ordinal_key(name: str) -> tuple:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def _without_times(status: dict[str, Any]) -> dict[str, Any]:
    out = dict(status)
    if "conditions" in out:
        out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in out["conditions"]]
    return out


@dataclass
class StepOutcome:
    cluster: dict[str, Any] | None = None     # the live object (for Events); None: gone
    move: Move | None = None
    reason: str = ""
    reading: pressure.Reading | None = None
    became_unavailable: bool = False
    recovered: bool = False


Read = tuple[dict[str, Any], ClusterSpec | None]   # the live LAPSCluster and spec_in_force of it


def step(kube: Kube, namespace: str, name: str, reading: pressure.Reading, now: float,
         uid: str | None = None, consecutive: bool = True, read: Read | None = None) -> StepOutcome:
    """One decision on `reading` for the live cluster (only incarnation `uid`, when given: a
    reading taken for a cluster since deleted and created again is not the new one's), under
    its lock; see the module docstring. `consecutive`: whether this process made the decision
    of the interval before (the one whose streak status holds). When not (a new operator process, or decisions
    missed while the API server or this process stalled), the move it wanted loses its
    confirmations: confirmIntervals counts intervals in a row, and a stale streak would let a
    move through on one fresh reading. `read`: the cluster and its spec as the caller just read
    them (the tick, for this decision); the first attempt decides on them instead of reading
    the cluster again, and an attempt after a conflict reads it afresh."""
    reads = iter([read])

    def attempt() -> StepOutcome:
        given = next(reads, None)
        with _afresh_if_gone(given):
            return _step(kube, namespace, name, reading, now, uid, consecutive, given)

    with cluster_lock(namespace, name):
        return retry_on_conflict(attempt)


@contextmanager
def _afresh_if_gone(given: object):
    """A 404 on an attempt that worked on what the caller read (`given`): the cluster was deleted
    (or a pod went) since, so a conflict, which retry_on_conflict answers with a fresh read that
    finds it gone, as a read under the lock would have."""
    try:
        yield
    except KubeError as exc:
        if given is None or exc.status != 404:
            raise
        raise KubeError(409, f"gone since it was read: {exc.message}") from exc


def _step(kube: Kube, namespace: str, name: str, reading: pressure.Reading, now: float,
          uid: str | None, consecutive: bool, read: Read | None) -> StepOutcome:
    if read is None:
        live = kube.get(cr_ref(namespace, name))
        if is_gone(live, uid):
            return StepOutcome()
        spec = spec_in_force(live)   # None also for a spec the API server refused: not the children's
    else:
        live, spec = read
    if spec is None:
        return StepOutcome(live, reason="invalid spec")
    if not active(spec):
        return StepOutcome(live, reason=OFF_DECISION)
    ref = cluster_ref(live)
    # The prefill pods, listed once: the group sync plans from them, and they say which serve.
    pods = prefill_pods(kube, ref)
    # Membership and labels consistent before deciding; `live` is then what the sync wrote.
    plan, live = record_groups(kube, ref, spec, live, pods, read_before_pods=True)
    old = live.get("status") or {}
    # The pods that serve: Ready (the gateways route to those alone, through the EndpointSlices)
    # and not terminating. They are a group's capacity, so its per-pod pressure and its
    # minPerGroup count them alone, and only one of them may move: a pod crash-looping, still
    # loading its model or being rolled would relieve nothing, and counted, a group's only
    # Ready pod could be moved away while the others were down, leaving its class unserved.
    serving = {p.name for p in pods if p.ready and not p.terminating}
    members = {g: [p for p in plan.groups[g] if p in serving] for g in CLASSES}
    # In-flight work per pod is not read per pod: all equal, so ties (the highest ordinal)
    # choose among the pods out of cooldown.
    state = state_from_status(old)
    if not consecutive:
        state = replace(state, wanted=None, streak=0)
    decision = decide(members, reading.totals, {}, state, now, config_of(spec))
    status = allocation_status(old, plan.groups, reading, decision, now)
    if not contains(old, _without_times(status)):
        patch_status(kube, namespace, name, status, live["metadata"].get("resourceVersion"))
    if decision.move is not None:
        try:
            label_pod(kube, namespace, decision.move.pod, decision.move.target)
        except KubeError as exc:
            if exc.status != 404:
                raise
            # Deleted since it was listed: the move is recorded (status.groups), so the pod its
            # StatefulSet makes again gets the new group from the group sync. The move stands,
            # with its Event and metrics.
    _record_metrics(ref, reading, decision, status.get("groupSizes") or plan.sizes)
    was = condition(old.get("conditions"), PRESSURE_UNAVAILABLE)
    was_unavailable = bool(was and was.get("status") == "True")
    return StepOutcome(live, decision.move, decision.reason, reading,
                       became_unavailable=not reading.known and not was_unavailable,
                       recovered=reading.known and was_unavailable)


def off_status(old: Mapping[str, Any] | None, now: float) -> dict[str, Any] | None:
    """What status says once the loop is turned off (pure); None when it never ran. The last
    pressure (shown by `kubectl get laps -o wide`) and decision would read as current, and a
    half-confirmed move would complete on the first interval after the loop is back on, however
    long after: confirmIntervals counts consecutive intervals. The cooldowns and the direction
    of the last move stay: they are about moves that really happened."""
    old = old or {}
    unavailable = condition(old.get("conditions"), PRESSURE_UNAVAILABLE)
    if not old.get("allocation") and not old.get("pressure") and unavailable is None:
        return None
    status: dict[str, Any] = {"pressure": None,
                              "allocation": {"lastDecision": OFF_DECISION, "policy": {"wanted": None, "streak": 0}}}
    if unavailable is not None:
        status["conditions"] = set_condition(old.get("conditions"), PRESSURE_UNAVAILABLE, False, "AllocationOff",
                                             "the allocation loop is off", generation=None, now=rfc3339(now))
    return status


def stood_down(status: Mapping[str, Any] | None, now: float) -> bool:
    """Whether status already says what off_status says (nothing to write)."""
    wanted = off_status(status, now)
    return wanted is None or contains(status or {}, _without_times(wanted))


def stand_down(kube: Kube, namespace: str, name: str, now: float, uid: str | None = None,
               live: dict[str, Any] | None = None) -> None:
    """The loop was turned off: nothing it last read or wanted holds any more (off_status).
    `live`: the cluster as the caller just read it, written on conditionally on its version (a
    conflict reads it afresh)."""
    reads = iter([live])
    with cluster_lock(namespace, name):
        def write() -> None:
            given = next(reads, None)
            live = given or kube.get(cr_ref(namespace, name))
            if is_gone(live, uid):
                return
            if not stood_down(live.get("status"), now):
                with _afresh_if_gone(given):
                    patch_status(kube, namespace, name, off_status(live.get("status"), now),
                                 live["metadata"].get("resourceVersion"))
        retry_on_conflict(write)


def _record_metrics(ref: ClusterRef, reading: pressure.Reading, decision: Decision, sizes: Mapping[str, int]) -> None:
    ns, name, uid = ref.namespace, ref.name, ref.uid
    metrics.record_groups(ns, name, uid, dict(sizes))
    metrics.record_pressure(ns, name, uid, reading.totals)
    if decision.move is not None:
        metrics.record_decision(ns, name, uid, "moved", decision.move.direction)
    else:
        metrics.record_decision(ns, name, uid, "held" if reading.known else "unknown")


class AllocationLoop:
    """One cluster's loop: `tick()` runs when due and returns the seconds until it is due
    again. It re-reads the spec every tick, so interval changes apply from the next decision.
    It belongs to one incarnation (`uid`): another cluster of the same name is not its own."""

    def __init__(self, kube: Kube, namespace: str, name: str, uid: str, clock=time.monotonic,
                 wall=time.time) -> None:
        self.kube, self.namespace, self.name, self.uid = kube, namespace, name, uid
        self.clock, self.wall = clock, wall
        self.window = pressure.GatewayWindow()
        self.last_decision: float | None = None
        self.decided: float | None = None   # clock() when this process last finished a decision

    def tick(self) -> tuple[float | None, StepOutcome | None]:
        """(seconds to the next tick or None when the cluster is gone, the step's outcome if one
        ran). The tick's one read of the cluster and its one parse of the spec serve the step."""
        live = self.kube.get(cr_ref(self.namespace, self.name))
        if is_gone(live, self.uid):
            return None, None
        spec = spec_in_force(live)   # a refused spec's interval and Prometheus are not in force either
        if spec is None:
            return OFF_RECHECK_S, None
        if not active(spec):
            self.window, self.last_decision, self.decided = pressure.GatewayWindow(), None, None
            metrics.record_pressure(self.namespace, self.name, self.uid, None)
            if not stood_down(live.get("status"), self.wall()):
                stand_down(self.kube, self.namespace, self.name, self.wall(), self.uid, live)
            return OFF_RECHECK_S, None
        interval = spec.laps.allocation.interval_seconds
        url = spec.monitoring.prometheus_url
        now = self.clock()
        if self.last_decision is None:
            self.last_decision = now   # the first decision one interval after the loop starts
        if not url:
            reading = pressure.scrape_gateways(self.kube, cluster_ref(live), GATEWAY_PORT)
            self.window.add(self.clock(), reading)   # when the counters were read, not before
        due = self.last_decision + interval
        if now < due:
            return min(due - now, SAMPLE_S if not url else due - now), None
        if not url and not self.window.ready:   # a rate needs two readings: the second comes next second
            return SAMPLE_S, None
        window = pressure.window_seconds(interval)
        if url:
            query = spec.monitoring.pressure_query or pressure.default_query(cluster_ref(live), window)
            reading = pressure.query_prometheus(url, query, self.wall(), max_age_s=2 * window)
        else:
            reading = self.window.take()
        # Measured from the end of the last decision, so a slow query or write (which delays the
        # next one by as much) never counts as a missed interval; a second interval of slack
        # covers the rest.
        consecutive = self.decided is not None and now - self.decided <= 2 * interval
        outcome = step(self.kube, self.namespace, self.name, reading, self.wall(), self.uid, consecutive,
                       (live, spec))
        self.decided = self.clock()
        self.last_decision = max(due, now - interval)   # no burst of catch-up decisions after a stall
        until_due = max(0.0, self.last_decision + interval - self.clock())
        return (min(until_due, SAMPLE_S) if not url else until_due), outcome
