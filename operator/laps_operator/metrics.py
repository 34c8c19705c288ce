"""The operator's `laps_operator_*` series (docs/contracts.md, "Metrics")."""
from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, start_http_server

GROUP_SIZE = Gauge("laps_operator_group_size", "Prefill pods planned per group", ["cluster", "group"])
REBALANCES = Counter("laps_operator_rebalances_total", "Prefill pods moved between groups by the allocation loop",
                     ["cluster", "direction"])
PRESSURE = Gauge("laps_operator_pressure", "Per-group pressure the allocation loop last read", ["cluster", "group"])
RECONCILES = Counter("laps_operator_reconciles_total", "LAPSCluster reconciles by result", ["result"])

for _result in ("ok", "invalid", "error"):
    RECONCILES.labels(result=_result)


def cluster_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def record_groups(namespace: str, name: str, sizes: dict[str, int]) -> None:
    for group, size in sizes.items():
        GROUP_SIZE.labels(cluster=cluster_key(namespace, name), group=group).set(size)


def forget_cluster(namespace: str, name: str) -> None:
    key = cluster_key(namespace, name)
    for metric in (GROUP_SIZE, PRESSURE):
        for group in ("short", "long"):
            try:
                metric.remove(key, group)
            except KeyError:
                pass


def serve(port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> None:
    start_http_server(port, addr=host, registry=registry)
