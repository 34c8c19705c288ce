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
    # Each role's engine: some series are a prefill engine's only, some a decode engine's.
    registries = [EngineMetrics("prefill", "m", None).registry, EngineMetrics("decode", "m", None).registry,
                  GatewayMetrics().registry]
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


RATIO_UNITS = {"percentunit"}
_TOP_LEVEL_DIVISION = re.compile(r"\)\s*/\s*(ignoring\([^)]*\)\s*group_left\s*)?\(?\s*sum")


def series_units(path: pathlib.Path) -> list[tuple[str, str, str]]:
    """(panel title, expr, unit Grafana shows that target's series in) for every target: the
    panel's default unit unless an override matched by the target's refId sets another."""
    shown = []
    for panel in json.loads(path.read_text())["panels"]:
        field_config = panel.get("fieldConfig", {})
        default = field_config.get("defaults", {}).get("unit", "")
        by_ref = {}
        for override in field_config.get("overrides", []):
            if override.get("matcher", {}).get("id") == "byFrameRefID":
                for prop in override.get("properties", []):
                    if prop.get("id") == "unit":
                        by_ref[override["matcher"]["options"]] = prop["value"]
        for target in panel.get("targets", []):
            shown.append((panel["title"], target["expr"], by_ref.get(target.get("refId"), default)))
    return shown


def test_each_series_is_shown_in_its_own_unit():
    """A share of two counters' rates (hit/lookup, disagreements/checks) reads as a percentage, a
    plain rate never does: a panel whose one unit covered both showed 3 evicted pages/s as
    "300%", or a 95% hit ratio as "0.95" on the axis of thousands of padding tokens/s."""
    wrong = []
    for path in DASHBOARDS:
        for title, expr, unit in series_units(path):
            # A mean (`_sum` over `_count`) is a quantity in its own unit, not a share.
            ratio = bool(_TOP_LEVEL_DIVISION.search(expr)) and "_sum" not in expr
            if ratio != (unit in RATIO_UNITS):
                wrong.append((title, unit, expr))
    assert wrong == []


def test_every_refusal_the_gateway_counts_is_on_a_dashboard():
    """A client getting 429s from the rate limit or 401s for its key saw nothing on the
    dashboard: those refusals never reach laps_gateway_errors_total, only their own counters."""
    from laps_agent.gateway.metrics import GatewayMetrics

    refusals = {name for family in families(GatewayMetrics().registry)
                if family.type == "counter" and "refused" in family.documentation
                for name in exposed_names(family)}
    assert {"laps_gateway_rate_limited_total", "laps_gateway_auth_failures_total"} <= refusals
    shown = {name for path in DASHBOARDS for expr in dashboard_queries(path)
             for name in SERIES.findall(expr)}
    assert refusals - shown == set()


# What a panel's series must be filtered by so the dashboard's Namespace selector applies to it.
# Gateway and engine series carry the scraped pod's `namespace`; the operator's carry the
# cluster it speaks of as `cluster="<namespace>/<name>"` (laps_operator.metrics.cluster_key),
# while their own `namespace` label is the operator's. `($namespace)` also holds Grafana's
# multi-value `(a|b)` and its All value `.*`.
NAMESPACE_FILTER = 'namespace=~"$namespace"'
CLUSTER_FILTER = 'cluster=~"($namespace)/.+"'
_SELECTED_SERIES = re.compile(r"\b(laps_[a-z0-9_]+)\s*(\{[^}]*\})?")


def panel_exprs(path: pathlib.Path) -> list[tuple[str, str]]:
    """(panel title, expr) of every panel target, panels inside rows included."""
    def walk(panels: list[dict]):
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))

    return [(panel["title"], target["expr"]) for panel in walk(json.loads(path.read_text())["panels"])
            for target in panel.get("targets", [])]


def test_every_panel_query_follows_the_namespace_selector():
    """Picking a namespace showed every namespace's LAPSClusters on the operator panels: their
    queries had no filter at all. Every series a panel reads must be filtered, each by the label
    that names the namespace of what it measures."""
    unfiltered = []
    for path in DASHBOARDS:
        for title, expr in panel_exprs(path):
            for name, selector in _SELECTED_SERIES.findall(expr):
                wanted = CLUSTER_FILTER if name.startswith("laps_operator_") else NAMESPACE_FILTER
                if wanted not in selector:
                    unfiltered.append((title, name, wanted))
    assert unfiltered == []


def test_passive_health_ejections_are_on_a_dashboard():
    """Pods the gateway takes out of routing (and the ejections its cap refuses) were on no
    panel: a pool running on half its pods looked healthy."""
    shown = {name for path in DASHBOARDS for expr in dashboard_queries(path)
             for name in SERIES.findall(expr)}
    assert "laps_gateway_ejections_total" in shown


CONTRACTS = ROOT / "docs" / "contracts.md"


def contract_metric_names() -> set[str]:
    """The `laps_*` names docs/contracts.md's Metrics section lists."""
    text = CONTRACTS.read_text()
    section = text.split("\n## Metrics", 1)[1].split("\n## ", 1)[0]
    return set(SERIES.findall(section))


def documented_names() -> set[str]:
    """What each exported family is called in the docs: counters by their `_total` series,
    gauges and histograms by their own name."""
    from laps_agent.engine.metrics import EngineMetrics
    from laps_agent.gateway.metrics import GatewayMetrics
    from laps_operator import metrics as operator_metrics

    found = set()
    collected = [f for r in (EngineMetrics("prefill", "m", None).registry, EngineMetrics("decode", "m", None).registry,
                             GatewayMetrics().registry)
                 for f in families(r)]
    collected += [f for v in vars(operator_metrics).values()
                  if callable(getattr(v, "describe", None)) and getattr(v, "_name", "").startswith("laps_")
                  for f in v.describe()]
    for family in collected:
        found.add(family.name + "_total" if family.type == "counter" else family.name)
    return found


def test_the_contract_lists_every_exported_series_and_no_other():
    """An SRE writing alerts goes by docs/contracts.md: four gateway counters the dashboard
    reads (cache affinity, class checks) were exported but listed nowhere there."""
    exported, listed = documented_names(), contract_metric_names()
    assert exported - listed == set(), "exported, not in docs/contracts.md"
    assert listed - exported == set(), "in docs/contracts.md, exported by no component"
