"""The operator's `laps_operator_*` series (docs/contracts.md, "Metrics")."""
from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, start_http_server

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

GROUPS = ("short", "long")
DIRECTIONS = ("short_to_long", "long_to_short")
RESULTS = ("moved", "held", "unknown")

for _result in ("ok", "invalid", "error"):
    RECONCILES.labels(result=_result)


def cluster_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def record_groups(namespace: str, name: str, sizes: dict[str, int]) -> None:
    for group, size in sizes.items():
        GROUP_SIZE.labels(cluster=cluster_key(namespace, name), group=group).set(size)


def forget_cluster(namespace: str, name: str) -> None:
    key = cluster_key(namespace, name)
    for metric, values in ((GROUP_SIZE, GROUPS), (PRESSURE, GROUPS), (REBALANCES, DIRECTIONS), (DECISIONS, RESULTS)):
        for value in values:
            try:
                metric.remove(key, value)
            except KeyError:
                pass


def start_cluster(namespace: str, name: str) -> None:
    """Zero move counters from the start, so rates and dashboards see both directions."""
    for direction in DIRECTIONS:
        REBALANCES.labels(cluster=cluster_key(namespace, name), direction=direction)
    for result in RESULTS:
        DECISIONS.labels(cluster=cluster_key(namespace, name), result=result)


def serve(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> None:
    start_http_server(port, addr=host, registry=registry)


def record_pressure(namespace: str, name: str, totals: dict[str, float] | None) -> None:
    """The group totals the loop last read; no series while pressure is unknown (a gap in a
    graph, not a made-up number)."""
    key = cluster_key(namespace, name)
    for group in ("short", "long"):
        if totals is None:
            try:
                PRESSURE.remove(key, group)
            except KeyError:
                pass
        else:
            PRESSURE.labels(cluster=key, group=group).set(float(totals[group]))


def record_decision(namespace: str, name: str, result: str, direction: str | None = None) -> None:
    key = cluster_key(namespace, name)
    DECISIONS.labels(cluster=key, result=result).inc()
    if direction is not None:
        REBALANCES.labels(cluster=key, direction=direction).inc()
