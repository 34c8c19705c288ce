"""The operator's `laps_operator_*` series (docs/contracts.md, "Metrics").

Per-cluster series belong to one incarnation of the cluster (its uid): `start_cluster` opens
them, `forget_cluster` removes them, and a write for any other uid is dropped. The check and the
write share one lock with the removal, so a loop tick or handler that was already under way when
the cluster was deleted (a Prometheus query or API call can take seconds) cannot put a deleted
cluster's series back, and a tick of a deleted cluster cannot write into the series of a new
cluster of the same name.
"""
from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, start_http_server

from laps_agent.policy.classes import CLASSES, OTHER

GROUP_SIZE = Gauge("laps_operator_group_size", "Prefill pods planned per group", ["cluster", "group"])
REBALANCES = Counter("laps_operator_rebalances_total", "Prefill pods moved between groups by the allocation loop",
                     ["cluster", "direction"])
PRESSURE = Gauge("laps_operator_pressure", "Per-group pressure the allocation loop last read (the group's pending "
                 "prefill tokens + 128 per pending request, averaged over the interval; absent while unknown)",
                 ["cluster", "group"])
DECISIONS = Counter("laps_operator_allocation_decisions_total", "Decisions of the allocation loop by result: "
                    "moved, held (pressure known, no move) or unknown (pressure unknown: no move)",
                    ["cluster", "result"])
RECONCILES = Counter("laps_operator_reconciles_total", "LAPSCluster reconciles by result", ["result"])
PLANNER_REPLICAS = Gauge("laps_operator_planner_replicas", "The planner's pod counts per pool: kind=desired (set), "
                         "need (what the SLOs need now, before limits and budget), actual (pods that exist)",
                         ["cluster", "pool", "kind"])
PLANNER_DECISIONS = Counter("laps_operator_planner_decisions_total", "Decisions of the planner by reason: "
                            "scaled_up, scaled_down, held, budget (held back by the GPU budget), frozen (metrics "
                            "missing or stale, costs unknown)", ["cluster", "reason"])

DIRECTIONS = tuple(f"{g}_to_{OTHER[g]}" for g in CLASSES)   # allocation.Move.direction
RESULTS = ("moved", "held", "unknown")
PLANNER_REASONS = ("scaled_up", "scaled_down", "held", "budget", "frozen")
PLANNER_KINDS = tuple((pool, kind) for pool in ("prefill", "decode") for kind in ("desired", "need", "actual"))

for _result in ("ok", "invalid", "error"):
    RECONCILES.labels(result=_result)

_lock = threading.Lock()
_incarnations: dict[str, str] = {}   # cluster key -> uid of the incarnation whose series are exported


def cluster_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def start_cluster(namespace: str, name: str, uid: str) -> None:
    """Open the series of this incarnation: a previous one's (deleted while the operator did not
    watch) are removed first; move counters start at zero, so rates and dashboards see both
    directions."""
    key = cluster_key(namespace, name)
    with _lock:
        if _incarnations.get(key) != uid:
            _remove(key)
        _incarnations[key] = uid
        for direction in DIRECTIONS:
            REBALANCES.labels(cluster=key, direction=direction)
        for result in RESULTS:
            DECISIONS.labels(cluster=key, result=result)
        for reason in PLANNER_REASONS:
            PLANNER_DECISIONS.labels(cluster=key, reason=reason)


def forget_cluster(namespace: str, name: str, uid: str | None = None) -> None:
    """Remove the cluster's series for good (only if they are `uid`'s, when given: a late
    deletion of an old incarnation leaves a new one's alone)."""
    key = cluster_key(namespace, name)
    with _lock:
        if uid is not None and _incarnations.get(key) not in (uid, None):
            return
        _incarnations.pop(key, None)
        _remove(key)


def _remove(key: str) -> None:
    for metric, values in ((GROUP_SIZE, CLASSES), (PRESSURE, CLASSES), (REBALANCES, DIRECTIONS), (DECISIONS, RESULTS),
                           (PLANNER_DECISIONS, PLANNER_REASONS)):
        for value in values:
            try:
                metric.remove(key, value)
            except KeyError:
                pass
    _remove_planner_replicas(key)


def _remove_planner_replicas(key: str) -> None:
    for pool, kind in PLANNER_KINDS:
        try:
            PLANNER_REPLICAS.remove(key, pool, kind)
        except KeyError:
            pass


def record_groups(namespace: str, name: str, uid: str, sizes: dict[str, int]) -> None:
    key = cluster_key(namespace, name)
    with _lock:
        if _incarnations.get(key) != uid:
            return
        for group, size in sizes.items():
            GROUP_SIZE.labels(cluster=key, group=group).set(size)


def record_pressure(namespace: str, name: str, uid: str, totals: dict[str, float] | None) -> None:
    """The group totals the loop last read; no series while pressure is unknown (a gap in a
    graph, not a made-up number)."""
    key = cluster_key(namespace, name)
    with _lock:
        if _incarnations.get(key) != uid:
            return
        for group in CLASSES:
            if totals is None:
                try:
                    PRESSURE.remove(key, group)
                except KeyError:
                    pass
            else:
                PRESSURE.labels(cluster=key, group=group).set(float(totals[group]))


def record_decision(namespace: str, name: str, uid: str, result: str, direction: str | None = None) -> None:
    key = cluster_key(namespace, name)
    with _lock:
        if _incarnations.get(key) != uid:
            return
        DECISIONS.labels(cluster=key, result=result).inc()
        if direction is not None:
            REBALANCES.labels(cluster=key, direction=direction).inc()


def record_plan(namespace: str, name: str, uid: str, reason: str, counts: dict[tuple[str, str], int] | None) -> None:
    """One planner decision (`reason`: PLANNER_REASONS) and its counts, (pool, kind) -> pods;
    None: autoscaling off, the gauges removed."""
    key = cluster_key(namespace, name)
    with _lock:
        if _incarnations.get(key) != uid:
            return
        if counts is None:
            _remove_planner_replicas(key)
            return
        PLANNER_DECISIONS.labels(cluster=key, reason=reason).inc()
        for (pool, kind), value in counts.items():
            PLANNER_REPLICAS.labels(cluster=key, pool=pool, kind=kind).set(value)


def serve(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> None:
    start_http_server(port, addr=host, registry=registry)
