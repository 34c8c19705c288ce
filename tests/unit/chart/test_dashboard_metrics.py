"""Every Grafana dashboard query names only series that laps code really exports.

The exported names come from the components' own metric registries (engine, gateway, operator),
expanded the way Prometheus exposes them (counters `_total`, histograms `_bucket/_sum/_count`),
so a renamed metric in code or a typo in a dashboard fails here rather than in a blank panel."""
from __future__ import annotations

import json
import pathlib
import re

from prometheus_client import CollectorRegistry, Metric

ROOT = pathlib.Path(__file__).resolve().parents[3]
DASHBOARDS = sorted((ROOT / "charts" / "laps" / "dashboards").glob("*.json"))
SERIES = re.compile(r"\blaps_[a-z0-9_]+\b")


def exposed_names(family: Metric) -> set[str]:
    if family.type == "counter":
        return {family.name + "_total"}
    if family.type == "histogram":
        return {family.name + s for s in ("_bucket", "_sum", "_count")}
    if family.type == "info":
        return {family.name + "_info"}
    return {family.name}


def families(registry: CollectorRegistry) -> list[Metric]:
    return list(registry.collect())


def exported_series() -> set[str]:
    from laps_agent.engine.metrics import EngineMetrics
    from laps_agent.gateway.metrics import GatewayMetrics
    from laps_operator import metrics as operator_metrics

    found: set[str] = set()
    registries = [EngineMetrics("prefill", "m", None).registry, GatewayMetrics().registry]
    for registry in registries:
        for family in families(registry):
            found |= exposed_names(family)
    for value in vars(operator_metrics).values():
        describe = getattr(value, "describe", None)
        if callable(describe) and getattr(value, "_name", "").startswith("laps_operator_"):
            for family in describe():
                found |= exposed_names(family)
    return found


def dashboard_queries(path: pathlib.Path) -> list[str]:
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        if isinstance(query, dict):
            exprs.append(query.get("query", ""))
    return exprs


def test_there_are_dashboards_with_queries():
    assert DASHBOARDS
    for path in DASHBOARDS:
        assert dashboard_queries(path)


def test_every_dashboard_query_names_only_exported_series():
    exported = exported_series()
    # Sanity: the contract's core series are among what the code exports.
    for name in ("laps_gateway_pending_tokens", "laps_engine_queue_requests", "laps_operator_group_size"):
        assert name in exported
    unknown = {}
    for path in DASHBOARDS:
        for expr in dashboard_queries(path):
            names = set(SERIES.findall(expr))
            assert names, f"{path.name}: query names no laps_ series: {expr}"
            missing = names - exported
            if missing:
                unknown[expr] = sorted(missing)
    assert unknown == {}, f"dashboard queries name series no component exports: {unknown}"
