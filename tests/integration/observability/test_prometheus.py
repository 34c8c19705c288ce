"""The Grafana dashboard's queries against a REAL Prometheus scraping a real PD stack.

Real `laps engine` processes (tiny model, one prefill and one decode) and a real gateway run on
loopback; Prometheus (the binary, started by the test) scrapes all three every second, with
`namespace`/`pod` labels added the way the chart's ServiceMonitor relabelling would. After a few
real requests (short and long class, streamed and not) every dashboard panel query must be
valid PromQL, and each gateway/engine panel must show data. The operator panels are checked
against the operator's own metrics code serving three LAPSClusters' series: picking namespaces
in the dashboard's selector shows exactly their clusters. tests/unit/chart/test_dashboard_metrics.py
checks the names statically; this checks what a user of the dashboard would actually see."""
from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest

from tests.support.fixtures_prometheus import PrometheusQueryError, PrometheusServer, ScrapeTarget
from tests.support.waiting import poll

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "charts" / "laps" / "dashboards" / "laps-overview.json"
NAMESPACE = "local"
# What Grafana substitutes for $namespace: `.*` is the dashboard's "All" value, several
# selected namespaces are one regex group.
ALL_NAMESPACES = ".*"
THRESHOLD = 32          # gateway length threshold, in (heuristic) tokens
SHORT_PROMPT = "Once upon a time"
# ~540 characters: well over the threshold by any tokenizer or heuristic.
# Long prompts, each its own (a repeat would be expected cached where it went: short work).
LONG_PROMPTS = [f"Request {n}. " + "The quick brown fox jumps over the lazy dog. " * 12 for n in range(3)]


def panel_queries(path: Path = DASHBOARD, namespace: str = ALL_NAMESPACES) -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana variables substituted, `namespace` for $namespace) for
    every panel, rows included."""
    variables = {"$__rate_interval": "1m", "${namespace}": namespace, "$namespace": namespace}

    def walk(panels):
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))

    queries = []
    for panel in walk(json.loads(path.read_text())["panels"]):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in variables.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"unsubstituted Grafana variable in {panel['title']}: {expr}"
            queries.append((panel["title"], expr))
    return queries


def by_label(result: list[dict], label: str) -> dict[str, float]:
    return {series["metric"].get(label, ""): float(series["value"][1]) for series in result}


@pytest.fixture
def pd_stack(tiny_pd_engines, gateway_server):
    """Gateway over one prefill engine (serving both groups, so each class routes to its own
    group) and one decode engine."""
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    prefill, decode = tiny_pd_engines.prefill, tiny_pd_engines.decode
    spec = StaticSpec((prefill.url,), (prefill.url,), (decode.url,))
    gateway = gateway_server(StaticDiscovery(spec, poll_s=0.05), served_model_name="test-model",
                             length_threshold=THRESHOLD)
    return gateway, prefill, decode


@pytest.fixture
def scraped_stack(pd_stack, prometheus_server) -> tuple[PrometheusServer, httpx.Client]:
    gateway, prefill, decode = pd_stack
    prom = prometheus_server([
        ScrapeTarget(prefill.url, pod="laps-prefill-0"),
        ScrapeTarget(decode.url, pod="laps-decode-0"),
        ScrapeTarget(gateway.url, pod="laps-gateway-0"),
    ])
    prom.wait_targets_up(timeout=20)
    with httpx.Client(base_url=gateway.url, timeout=120, trust_env=False) as client:
        yield prom, client


def send_traffic(client: httpx.Client) -> dict[str, int]:
    """Requests of both classes, streamed and not, plus one bad request; returns sent per class."""
    def completion(prompt: str, stream: bool) -> None:
        body = {"model": "test-model", "prompt": prompt, "max_tokens": 3, "temperature": 0,
                "stream": stream}
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        if stream:
            assert response.text.rstrip().endswith("data: [DONE]")
        else:
            assert response.json()["choices"][0]["text"]

    def chat(prompt: str, stream: bool) -> None:
        body = {"model": "test-model", "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 3, "temperature": 0, "stream": stream}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text

    completion(SHORT_PROMPT, stream=False)
    chat(SHORT_PROMPT, stream=True)
    completion(LONG_PROMPTS[0], stream=True)
    chat(LONG_PROMPTS[1], stream=False)
    completion(LONG_PROMPTS[2], stream=False)
    # The errors panel groups by reason; give it one real error to show.
    wrong = client.post("/v1/completions", json={"model": "no-such-model", "prompt": "x"})
    assert wrong.status_code == 404, wrong.text
    return {"short": 2, "long": 3}


def test_dashboard_queries_show_a_real_pd_stack(scraped_stack):
    prom, client = scraped_stack
    sent = send_traffic(client)
    local = f'namespace="{NAMESPACE}"'

    # The gateway's counters count what was sent, by class, each class in its own group.
    per_class_group = prom.wait_for(
        f"sum by (class, group) (laps_gateway_requests_total{{{local}}}) > 0",
        lambda r: sum(float(s["value"][1]) for s in r) == sum(sent.values()))
    assert {(s["metric"]["class"], s["metric"]["group"]): float(s["value"][1])
            for s in per_class_group} == {("short", "short"): 2, ("long", "long"): 3}
    # Every routed request finished, so each one has a latency sample.
    finished = prom.wait_for(
        f"sum by (class) (laps_gateway_request_seconds_count{{{local}}})",
        lambda r: by_label(r, "class") == {"short": 2, "long": 3})
    assert by_label(finished, "class") == sent
    errors = prom.wait_for(f"sum by (reason) (laps_gateway_errors_total{{{local}}})",
                           lambda r: by_label(r, "reason") == {"unknown_model": 1})
    assert by_label(errors, "reason") == {"unknown_model": 1}

    # Engine identity: one prefill and one decode engine, each in its pod, with the model name.
    info = prom.query(f"laps_engine_info{{{local}}}")
    assert {(s["metric"]["role"], s["metric"]["pod"]) for s in info} == {
        ("prefill", "laps-prefill-0"), ("decode", "laps-decode-0")}
    assert all(s["metric"]["model"] == "test-model" for s in info)
    # The dashboard's $namespace variable is `label_values(laps_engine_info, namespace)`.
    namespaces = prom.api("label/namespace/values", **{"match[]": "laps_engine_info"})
    assert namespaces == [NAMESPACE]

    # Every panel: valid PromQL; gateway and engine panels show data. rate() needs two samples
    # after the traffic, hence polling each until it is non-empty.
    checked_with_data, checked_valid_only = [], []
    for title, expr in panel_queries():
        prom.query(expr)  # raises PrometheusQueryError (with Prometheus's message) if invalid
        if "laps_operator_" in expr:
            checked_valid_only.append(title)  # no operator here: see the next test
            continue
        result = prom.wait_for(expr, bool, timeout=20)
        assert all(len(s["value"]) == 2 for s in result), (title, result)
        checked_with_data.append(title)
    assert checked_with_data and checked_valid_only

    # The request-rate panel shows traffic in both classes, not just zero-valued series.
    rate_panel = next(e for t, e in panel_queries() if "laps_gateway_requests_total" in e)
    rates = prom.wait_for(rate_panel, lambda r: {s["metric"]["class"] for s in r
                                                 if float(s["value"][1]) > 0} == {"short", "long"})
    assert all(not math.isnan(float(s["value"][1])) for s in rates)
    # Per-pod panels name the engine pods.
    kv_panel = next(e for t, e in panel_queries() if "laps_engine_kv_usage_ratio" in e)
    assert {s["metric"]["pod"] for s in prom.query(kv_panel)} == {"laps-prefill-0", "laps-decode-0"}
    # The headroom panel: the prefill pod alone (a decode engine prefills nothing), its measured
    # figure beside its queued tokens.
    figure, queued = [e for t, e in panel_queries() if "laps_engine_prefill_in_time_tokens" in e]
    assert {s["metric"]["pod"]: float(s["value"][1]) > 0 for s in prom.query(figure)} == {"laps-prefill-0": True}
    assert {s["metric"]["pod"] for s in prom.query(queued)} == {"laps-prefill-0"}


def test_invalid_promql_is_reported_with_prometheus_message(prometheus_server):
    """The validity check above is real: Prometheus rejects a broken query with its reason."""
    prom = prometheus_server([])
    with pytest.raises(PrometheusQueryError, match="bad_data"):
        prom.query("sum by (class (laps_gateway_requests_total)")
    assert prom.query("vector(1)")[0]["value"][1] == "1"


# LAPSClusters the operator reports on, as `cluster` = "<namespace>/<name>"; `team-ab` would
# also match an unanchored or slash-less `team-a` filter.
OPERATOR_CLUSTERS = ("team-a/chat", "team-ab/chat", "team-b/code")
OPERATOR_NAMESPACE = "laps-system"


@pytest.fixture
def operator_metrics_url():
    """The operator's own metrics code (laps_operator.metrics) recording OPERATOR_CLUSTERS, served
    from this process's default registry as `laps operator` serves it; forgotten at teardown."""
    from prometheus_client import REGISTRY, start_http_server

    from laps_operator import metrics

    clusters = [tuple(key.split("/")) for key in OPERATOR_CLUSTERS]
    for namespace, name in clusters:
        uid = f"uid-{namespace}-{name}"
        metrics.start_cluster(namespace, name, uid)
        metrics.record_groups(namespace, name, uid, {"short": 2, "long": 2})
        metrics.record_pressure(namespace, name, uid, {"short": 300.0, "long": 40.0})
        metrics.record_plan(namespace, name, uid, "held", {(pool, kind): 2 for pool in ("prefill", "decode")
                                                           for kind in ("desired", "need", "actual")})
    server, thread = start_http_server(0, addr="127.0.0.1", registry=REGISTRY)
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        for namespace, name in clusters:
            metrics.forget_cluster(namespace, name)


def test_operator_panels_show_only_the_selected_namespaces_clusters(operator_metrics_url, prometheus_server):
    """Picking a namespace in the dashboard left the operator panels showing every namespace's
    LAPSClusters: the operator's series carry its own pod's namespace, not the clusters'. Here
    Prometheus labels them `namespace="laps-system"`, as scraping the operator pod would."""
    prom = prometheus_server([ScrapeTarget(operator_metrics_url, pod="laps-operator-0")],
                             namespace=OPERATOR_NAMESPACE)
    prom.wait_targets_up(timeout=20)

    def clusters_shown(namespace: str) -> list[tuple[str, set[str]]]:
        """(panel title, clusters its series name) for each operator query, with `namespace`
        substituted for $namespace."""
        return [(title, {s["metric"]["cluster"] for s in prom.query(expr)})
                for title, expr in panel_queries(namespace=namespace) if "laps_operator_" in expr]

    def all_shown() -> list[tuple[str, set[str]]] | None:
        # At least these three: the registry is the test process's, which other tests use too.
        shown = clusters_shown(ALL_NAMESPACES)
        return shown if all(clusters >= set(OPERATOR_CLUSTERS) for _, clusters in shown) else None

    # increase() needs two scrapes of the rebalance counters before that query has a series
    # (20 s was not enough once on a 2-core machine running two test workers and a simulation).
    everything = poll(all_shown, timeout=60, interval=0.25,
                      message="every operator query to show the three clusters")
    titles = [title for title, _ in everything]
    # One namespace picked (Grafana sends a single value as is, or as a one-value group) and two.
    for selection, expected in (("team-a", {"team-a/chat"}), ("(team-a)", {"team-a/chat"}),
                                ("(team-a|team-b)", {"team-a/chat", "team-b/code"})):
        assert clusters_shown(selection) == [(title, expected) for title in titles], selection
    # The operator's own namespace is not the clusters' one: picking it shows none of them.
    assert clusters_shown(OPERATOR_NAMESPACE) == [(title, set()) for title in titles]
