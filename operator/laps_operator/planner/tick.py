"""The planner's step on Kubernetes, free of kopf: an observation in, the pools' counts out.

With `spec.autoscaling.enabled`, once per interval: read what Prometheus observed (observe.py),
ask `policy.planner.plan` (the policy `laps sim --autoscale` runs), and write status.autoscaling
(desired and actual counts per pool, the decision and its reason, the planner's memory, so a
restarted operator goes on where it was) and the AutoscalingFrozen condition, conditionally on
the version read. The pools run the desired counts: `replicas_in_force` puts them in the spec
every reader parses (reconcile/cycle.parse_cluster), and the caller reconciles at once when they
changed. A prefill scale-down moves the work off the ordinals the StatefulSet will remove (its
highest) first (`drain_step`): those pods are labelled `laps.io/prefill-group=draining`, which
takes them out of the group Services (the gateway sends them nothing new) and out of the groups
(policy.groups rule 0); once Prometheus shows their queues empty (or after DRAIN_DEADLINE
intervals) the count is lowered, and each pod finishes what is left as it terminates (spec.drain).
Wanted back meanwhile, they lose the label and rejoin the groups. The decode Deployment's pods
are drained as they terminate (out of the Service first, the held requests finished, new ones
retried elsewhere), and the ReplicaSet removes first the pods holding the fewest requests: the
planner gives those the lowest `controller.kubernetes.io/pod-deletion-cost` before the count drops.
With autoscaling off nothing is planned, no count is written, and the replicas are the spec's,
exactly as without a planner; status.autoscaling is removed once.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from laps_agent.policy.classes import LONG, SHORT
from laps_agent.policy.groups import DRAINING
from laps_agent.policy.planner import POOLS, Plan, PlannerConfig, PlannerState, Pools, Slo, drain_order, plan
from laps_operator import metrics
from laps_operator.allocation.tick import rfc3339
from laps_operator.naming import GROUP_LABEL, ClusterRef, role_selector
from laps_operator.planner import observe
from laps_operator.reconcile.cycle import cluster_ref, is_gone, spec_in_force
from laps_operator.reconcile.kube import Kube, KubeError, Ref
from laps_operator.reconcile.writers import cluster_lock, cr_ref, patch_status, retry_on_conflict
from laps_operator.spec.cluster import ClusterSpec
from laps_operator.spec.gpus import engine_gpus
from laps_operator.status.conditions import condition, set_condition

FROZEN = "AutoscalingFrozen"
OFF_RECHECK_S = 10.0
# A prefill pod taken out of routing for a scale-down goes at the latest after this many
# intervals, its queue empty or not (what is left, it finishes as it terminates).
DRAIN_DEADLINE = 4
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"   # the ReplicaSet removes the lowest first
# The needs kept for the stabilisation window at most (status stays small: 1000 x 3 numbers).
MAX_NEEDS = 1000


def config_of(spec: ClusterSpec) -> PlannerConfig:
    """The planner's limits from spec.autoscaling; ValueError naming what cannot hold (a budget
    below the minimum pools' GPUs)."""
    a = spec.autoscaling
    return PlannerConfig(min_prefill=a.prefill.min, max_prefill=a.prefill.max, min_decode=a.decode.min,
                         max_decode=a.decode.max, gpu_budget=a.gpu_budget,
                         gpus_per_prefill=engine_gpus(spec.engine, spec.prefill) or 0,
                         gpus_per_decode=engine_gpus(spec.engine, spec.decode) or 0, interval_s=a.interval_seconds,
                         max_step=a.max_step, scale_down_stabilization_s=a.scale_down_stabilization_seconds,
                         startup_s=a.startup_seconds)


def slo_of(spec: ClusterSpec) -> Slo:
    return Slo({SHORT: spec.slo.ttft_p90_seconds.short, LONG: spec.slo.ttft_p90_seconds.long},
               spec.slo.itl_p90_seconds)


def state_from_status(status: Mapping[str, Any] | None) -> PlannerState:
    raw = (((status or {}).get("autoscaling") or {}).get("planner")) or {}
    needs = tuple((float(n["t"]), int(n["prefill"]), int(n["decode"])) for n in raw.get("needs") or ()
                  if isinstance(n, dict) and {"t", "prefill", "decode"} <= set(n))
    last = ((float(raw["lastRateTime"]), float(raw["lastRate"]))
            if isinstance(raw.get("lastRate"), (int, float)) and isinstance(raw.get("lastRateTime"), (int, float))
            else None)
    directions = {p: int(v) for p, v in (raw.get("directions") or {}).items() if p in POOLS and v in (1, -1)}
    return PlannerState(needs, last, float(raw.get("trend") or 0.0), directions, int(raw.get("changes") or 0))


def state_to_status(state: PlannerState) -> dict[str, Any]:
    return {"needs": [{"t": round(t, 3), "prefill": p, "decode": d} for t, p, d in state.needs[-MAX_NEEDS:]],
            "lastRate": None if state.last_rate is None else round(state.last_rate[1], 4),
            "lastRateTime": None if state.last_rate is None else round(state.last_rate[0], 3),
            "trend": round(state.trend, 6), "directions": dict(state.directions), "changes": state.changes}


def frozen_reason(decision: Plan, reading: observe.Reading, limits_problem: str | None) -> str:
    if limits_problem:
        return "InvalidLimits"
    if reading.reason:
        return reading.reason
    if decision.reason.startswith("metrics stale"):
        return "MetricsStale"
    return "CostsUnknown" if decision.reason.startswith("costs unknown") else "MetricsMissing"


def decision_kind(decision: Plan, desired: Pools) -> str:
    """The decision-reason label of laps_operator_planner_decisions_total."""
    if decision.frozen:
        return "frozen"
    if decision.prefill > desired.prefill or decision.decode > desired.decode:
        return "scaled_up"
    if decision.prefill < desired.prefill or decision.decode < desired.decode:
        return "scaled_down"
    return "budget" if "budget" in decision.reason else "held"


def planner_status(old: Mapping[str, Any] | None, decision: Plan, existing: Pools, reason: str, now: float
                   ) -> dict[str, Any]:
    """status.autoscaling and the AutoscalingFrozen condition after one decision (pure)."""
    old = old or {}
    stamp = rfc3339(now)
    autoscaling = {"desired": {"prefill": decision.prefill, "decode": decision.decode},
                   "actual": {"prefill": existing.prefill, "decode": existing.decode},
                   "lastDecision": decision.reason, "lastDecisionTime": stamp,
                   "planner": state_to_status(decision.state)}
    if decision.short >= 0:   # frozen: the need is not known, the last one stands
        autoscaling["shortNeed"] = decision.short
    if decision.frozen:
        conditions = set_condition(old.get("conditions"), FROZEN, True, reason, decision.reason,
                                   generation=None, now=stamp)
    else:
        conditions = set_condition(old.get("conditions"), FROZEN, False, "Planning", "the planner has what it needs",
                                   generation=None, now=stamp)
    return {"autoscaling": autoscaling, "conditions": conditions}


@dataclass(frozen=True)
class DrainStep:
    prefill: int                        # the StatefulSet's replicas now
    draining: dict[str, Any] | None     # status.autoscaling.draining after this step
    relabel: dict[str, str | None]      # pod -> group label to write (None: remove it)


def drain_step(statefulset: str, current: int, wanted: int, draining: Mapping[str, Any] | None, now: float,
               drained: bool, deadline_s: float) -> DrainStep:
    """The prefill count to set when the planner wants `wanted` pods and `current` run (pure):
    down only once the departing ordinals (wanted..current-1) were out of routing and `drained`
    (their queues empty), or `deadline_s` after they were taken out."""
    before = list((draining or {}).get("pods") or ())
    if wanted >= current:
        return DrainStep(wanted, None, dict.fromkeys(before))   # none leaves: any draining pod comes back
    departing = [f"{statefulset}-{i}" for i in range(wanted, current)]
    relabel: dict[str, str | None] = {p: DRAINING for p in departing if p not in before}
    relabel.update({p: None for p in before if p not in departing})
    since = float((draining or {}).get("since") or now) if not relabel else now
    if not relabel and (drained or now - since >= deadline_s):
        return DrainStep(wanted, None, {})
    return DrainStep(current, {"pods": departing, "target": wanted, "since": round(since, 3)}, relabel)


@dataclass
class StepOutcome:
    cluster: dict[str, Any] | None = None
    decision: Plan | None = None
    changed: bool = False            # the desired counts changed: the pools must follow
    became_frozen: bool = False
    resumed: bool = False


def _mark_decode_leavers(kube: Kube, ref: ClusterRef, decode_pods: list[dict[str, Any]], count: int,
                         held: Mapping[str, float]) -> None:
    """Before the decode Deployment shrinks by `count`: its pods holding the fewest requests get
    the lowest deletion cost, so its ReplicaSet removes those (policy.planner.drain_order)."""
    pods = [p for p in decode_pods if not p["metadata"].get("deletionTimestamp")]
    leaving = set(drain_order([p["metadata"]["name"] for p in pods], held, ordinals=False)[:count])
    for pod in pods:
        name = pod["metadata"]["name"]
        cost = "-100" if name in leaving else None
        if (pod["metadata"].get("annotations") or {}).get(DELETION_COST) == cost:
            continue
        try:
            kube.patch(Ref("v1", "Pod", ref.namespace, name), {"metadata": {"annotations": {DELETION_COST: cost}}})
        except KubeError as exc:
            if exc.status != 404:
                raise


def engine_pods(kube: Kube, ref: ClusterRef) -> dict[str, list[dict[str, Any]]]:
    """The engine pods of each pool that exist, terminating ones too (they hold their GPUs)."""
    return {pool: kube.list(Ref("v1", "Pod", ref.namespace), role_selector(ref.name, pool)) for pool in POOLS}


def step(kube: Kube, namespace: str, name: str, reading: observe.Reading, now: float, uid: str | None = None,
         drained: bool = False) -> StepOutcome:
    """One decision under the cluster's lock. `drained`: the prefill pods status says are
    draining hold no queued work (read from Prometheus by the caller, outside the lock)."""
    def attempt() -> StepOutcome:
        live = kube.get(cr_ref(namespace, name))
        if is_gone(live, uid):
            return StepOutcome()
        spec = spec_in_force(live)
        if spec is None or not spec.autoscaling.enabled:
            return StepOutcome(live)
        return _step(kube, live, spec, reading, now, drained)

    with cluster_lock(namespace, name):
        return retry_on_conflict(attempt)


def _step(kube: Kube, live: dict[str, Any], spec: ClusterSpec, reading: observe.Reading, now: float,
          drained: bool) -> StepOutcome:
    ref = cluster_ref(live)
    old = live.get("status") or {}
    desired = Pools(spec.prefill.replicas, spec.decode.replicas)   # in force: the planner's last
    pods = engine_pods(kube, ref)
    existing = Pools(*(len(pods[pool]) for pool in POOLS))
    state = state_from_status(old)
    problem = None
    try:
        config = config_of(spec)
    except ValueError as exc:
        problem = f"spec.autoscaling: {exc}"
    if problem is not None:
        decision = Plan(desired.prefill, desired.decode, -1, problem, True, state)
    else:
        decision = plan(reading.observation, reading.costs, slo_of(spec), desired, existing, state, now, config)
        if decision.frozen and reading.message:
            decision = Plan(desired.prefill, desired.decode, -1, f"{decision.reason}: {reading.message}", True, state)
    reason = frozen_reason(decision, reading, problem)
    draining = (old.get("autoscaling") or {}).get("draining")
    relabel: dict[str, str | None] = {}
    if not decision.frozen:
        drain = drain_step(ref.prefill, desired.prefill, decision.prefill, draining, now, drained,
                           DRAIN_DEADLINE * spec.autoscaling.interval_seconds)
        draining, relabel = drain.draining, drain.relabel
        if drain.prefill != decision.prefill:
            decision = replace(decision, prefill=drain.prefill, reason=f"{decision.reason}; the work moves off "
                               f"{', '.join(draining['pods'])} before the prefill pods go to {draining['target']}")
    if decision.decode < desired.decode:
        _mark_decode_leavers(kube, ref, pods["decode"], desired.decode - decision.decode, reading.decode_held)
    status = planner_status(old, decision, existing, reason, now)
    status["autoscaling"]["draining"] = draining
    patch_status(kube, ref.namespace, ref.name, status, live["metadata"].get("resourceVersion"))
    for pod, group in relabel.items():   # after status: a restarted operator finds what it meant
        try:
            kube.patch(Ref("v1", "Pod", ref.namespace, pod), {"metadata": {"labels": {GROUP_LABEL: group}}})
        except KubeError as exc:
            if exc.status != 404:   # not made yet, or gone: nothing routes to it
                raise
    counts = {(p, "desired"): getattr(decision, p) for p in POOLS}
    counts.update({(p, "actual"): getattr(existing, p) for p in POOLS})
    if decision.need is not None:
        counts.update({(p, "need"): getattr(decision.need, p) for p in POOLS})
    metrics.record_plan(ref.namespace, ref.name, ref.uid, decision_kind(decision, desired), counts)
    was = condition(old.get("conditions"), FROZEN)
    was_frozen = bool(was and was.get("status") == "True")
    return StepOutcome(live, decision, (decision.prefill, decision.decode) != (desired.prefill, desired.decode),
                       became_frozen=decision.frozen and not was_frozen, resumed=was_frozen and not decision.frozen)


def stand_down(kube: Kube, namespace: str, name: str, uid: str | None, now: float) -> None:
    """Autoscaling was turned off: status.autoscaling goes, and the condition says it is off."""
    def write() -> None:
        live = kube.get(cr_ref(namespace, name))
        if is_gone(live, uid):
            return
        old = live.get("status") or {}
        if not old.get("autoscaling") and condition(old.get("conditions"), FROZEN) is None:
            return
        conditions = set_condition(old.get("conditions"), FROZEN, False, "AutoscalingOff", "autoscaling is off",
                                   generation=None, now=rfc3339(now))
        patch_status(kube, namespace, name, {"autoscaling": None, "conditions": conditions},
                     live["metadata"].get("resourceVersion"))

    with cluster_lock(namespace, name):
        retry_on_conflict(write)


class PlannerLoop:
    """One cluster's planner: `tick()` runs when due and returns the seconds until it is due again."""

    def __init__(self, kube: Kube, namespace: str, name: str, uid: str, clock=time.monotonic, wall=time.time,
                 read=observe.read, queued=observe.queued) -> None:
        self.kube, self.namespace, self.name, self.uid = kube, namespace, name, uid
        self.clock, self.wall, self.read, self.queued = clock, wall, read, queued
        self.last_decision: float | None = None

    def tick(self) -> tuple[float | None, StepOutcome | None]:
        live = self.kube.get(cr_ref(self.namespace, self.name))
        if is_gone(live, self.uid):
            return None, None
        spec = spec_in_force(live)
        if spec is None:
            return OFF_RECHECK_S, None
        if not spec.autoscaling.enabled:
            self.last_decision = None
            status = live.get("status") or {}
            if status.get("autoscaling") or (condition(status.get("conditions"), FROZEN) or {}).get("status") == "True":
                stand_down(self.kube, self.namespace, self.name, self.uid, self.wall())
                metrics.record_plan(self.namespace, self.name, self.uid, "held", None)
            return OFF_RECHECK_S, None
        interval = spec.autoscaling.interval_seconds
        now = self.clock()
        if self.last_decision is None:
            self.last_decision = now     # the first decision one interval after the planner starts
        due = self.last_decision + interval
        if now < due:
            return due - now, None
        url, ref = spec.monitoring.prometheus_url, cluster_ref(live)
        reading = self.read(url, ref, interval, self.wall())
        draining = (((live.get("status") or {}).get("autoscaling") or {}).get("draining") or {}).get("pods")
        drained = bool(draining) and self.queued(url, ref, draining) == 0
        outcome = step(self.kube, self.namespace, self.name, reading, self.wall(), self.uid, drained)
        self.last_decision = max(due, now - interval)
        return max(0.0, self.last_decision + interval - self.clock()), outcome
