"""Pressure readings: Prometheus instant-query answers and the gateways' own /metrics, and
every way a reading becomes "unknown" (which means: no move)."""
from __future__ import annotations

import re

import pytest

from laps_operator.allocation.pressure import (
    GatewayWindow,
    Reading,
    default_query,
    gateway_pod_regex,
    parse_gateway_metrics,
    parse_prometheus,
    query_prometheus,
    unknown,
    window_seconds,
)
from laps_operator.naming import ClusterRef
from laps_operator.render.builders import scrape_interval_seconds
from laps_operator.spec.cluster import InvalidSpecError, parse_spec

NOW = 1_800_000_000.0


def vector(*samples: tuple[dict, float], stamp: float = NOW) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": metric, "value": [stamp, str(value)]} for metric, value in samples]}}


def test_a_vector_with_both_groups_gives_their_totals():
    reading = parse_prometheus(200, vector(({"group": "short"}, 12.5), ({"group": "long"}, 4000)), NOW, 10)
    assert reading.known and reading.totals == {"short": 12.5, "long": 4000.0}


def test_series_of_one_group_are_summed_and_other_labels_ignored():
    # A custom query that forgot `sum by (group)`: one series per gateway replica.
    body = vector(({"group": "short", "pod": "g-1"}, 1), ({"group": "short", "pod": "g-2"}, 2),
                  ({"group": "long", "pod": "g-1"}, 5), ({"group": "other"}, 99), ({}, 7))
    assert parse_prometheus(200, body, NOW, 10).totals == {"short": 3.0, "long": 5.0}


@pytest.mark.parametrize(("status_code", "body", "reason", "says"), [
    (200, vector(({"group": "short"}, 1)), "GroupMissing", "group long"),
    (200, vector(), "NoSeries", "no series"),
    (200, vector(({"group": "short"}, 1), ({"group": "long"}, 2), stamp=NOW - 60), "Stale", "60s old"),
    (400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}, "PrometheusError",
     "bad_data: parse error"),
    (503, {"status": "error", "errorType": "unavailable", "error": "not ready"}, "PrometheusError", "HTTP 503"),
    (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}, "BadQuery", "instant vector"),
    (200, vector(({"group": "short"}, float("nan")), ({"group": "long"}, 1)), "NoSeries", "nan"),
    (200, [1, 2], "PrometheusError", "not a JSON object"),
    # JSON, but not Prometheus' query API (a URL pointing at another service): a reason, not a crash.
    (200, {"status": "success", "data": [1]}, "PrometheusError", "`data` is not a query result"),
    (200, {"status": "success", "data": {"resultType": "vector", "result": {"short": 1}}}, "PrometheusError",
     "not a list of samples"),
    (200, {"status": "success", "data": {"resultType": "vector", "result": [None, "x"]}}, "PrometheusError",
     "not a list of samples"),
])
def test_doubtful_answers_are_unknown_with_a_reason(status_code, body, reason, says):
    reading = parse_prometheus(status_code, body, NOW, max_age_s=10)
    assert not reading.known
    assert reading.reason == reason and says in reading.message


def test_default_query_sums_every_gateway_replica_of_the_cluster_over_the_window():
    query = default_query(ClusterRef("chat", "serving", "u"), window_seconds(5))
    name = "[bcdfghjklmnpqrstvwxz2456789]+"   # what Kubernetes generates names in
    selector = f'{{namespace="serving",pod=~"chat-gateway-{name}(-{name})?"}}[5000ms]'
    # The offered prefill work per second of each class (policy/allocation.py), named as its group.
    assert query == (f'sum by (group) (label_replace(rate(laps_gateway_offered_prefill_seconds_total{selector}), '
                     '"group", "$1", "class", "(.*)"))')


def test_gateway_pod_regex_selects_this_clusters_deployment_pods_only():
    # What PromQL's fully anchored regex does, with the PromQL string's escapes undone.
    pattern = re.compile(gateway_pod_regex(ClusterRef("a.b", "ns", "u")).replace("\\\\", "\\"))
    assert pattern.fullmatch("a.b-gateway-7d9f8c6b5-x2x7z")
    assert not pattern.fullmatch("axb-gateway-7d9f8c6b5-x2x7z")          # the dot is literal
    assert not pattern.fullmatch("a.b-gateway-b-gateway-7d9f8c6b5-x2x7z")  # cluster "a.b-gateway-b"
    assert not pattern.fullmatch("a.b-prefill-0")


def test_gateway_pod_regex_matches_pods_whose_generated_name_kubernetes_cut():
    """A Deployment's pod is `<replicaset>-` cut to 58 characters plus 5 random ones: for a
    cluster name of 39 to 44 characters (the longest allowed) the dash before them is gone."""
    for length in (38, 39, 44):
        cluster = ClusterRef("c" * length, "ns", "u")
        replicaset = f"{cluster.gateway}-7d9f8c6b5d"            # a 10-character template hash
        pod = f"{replicaset}-"[:58] + "x7k2p"                   # the API server's generateName
        pattern = re.compile(gateway_pod_regex(cluster))
        assert pattern.fullmatch(pod), pod
        assert not pattern.fullmatch(f"{cluster.gateway}-b-gateway-7d9f8c6b5d-x7k2p")


def test_gateway_pod_regex_leaves_out_the_pods_of_a_cluster_named_after_this_ones_gateway():
    """Cluster X (31 to 36 characters) and cluster `X-gateway` beside it: cut, Y's gateway pods
    are `X-gateway-gateway-<hash cut><suffix>`, which [a-z0-9] segments matched, so X's pressure
    held Y's pending work. Generated names have no vowels: `gateway` is never one of them."""
    for length in range(31, 37):
        x = ClusterRef("x" * length, "ns", "u")
        y = ClusterRef(f"{x.name}-gateway", "ns", "u")
        y_pod = f"{y.gateway}-7d9f8c6b5d-"[:58] + "x7k2p"
        assert re.fullmatch(gateway_pod_regex(y), y_pod)
        assert not re.fullmatch(gateway_pod_regex(x), y_pod), y_pod


def test_window_and_scrape_interval_leave_two_scrapes_per_window():
    for interval in (1, 2, 5, 30, 120):
        assert window_seconds(interval) >= 2 * scrape_interval_seconds(interval)
        assert window_seconds(interval) >= interval
    assert (window_seconds(1), scrape_interval_seconds(1)) == (4.0, 1.0)
    assert (window_seconds(5), scrape_interval_seconds(5)) == (5.0, 2.5)


def gateway_metrics_text(short: float, long: float) -> str:
    from laps_agent.gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics()   # the gateway's own registry: the real exposition format
    metrics.offered_prefill_of["short"].inc(short)
    metrics.offered_prefill_of["long"].inc(long)
    return metrics.render().decode()


def test_the_fallback_parser_reads_a_real_gateway_exposition():
    assert parse_gateway_metrics(gateway_metrics_text(0.5, 7.25)) == {"short": 0.5, "long": 7.25}


@pytest.mark.parametrize(("text", "says"), [
    ("# nothing here\n", "no laps_gateway_offered_prefill_seconds_total for class short, long"),
    ('laps_gateway_offered_prefill_seconds_total{class="short"} 1\n', "for class long$"),
])
def test_the_fallback_parser_refuses_incomplete_metrics(text, says):
    with pytest.raises(ValueError, match=says):
        parse_gateway_metrics(text)


def test_gateway_window_takes_the_rate_over_the_interval_and_one_failed_reading_spoils_it():
    window = GatewayWindow()
    assert window.take().reason == "NoSamples"
    window.add(0.0, Reading({"short": 0, "long": 100}, source="gateways"))
    window.add(1.0, Reading({"short": 1, "long": 101}, source="gateways"))
    window.add(2.0, Reading({"short": 2, "long": 104}, source="gateways"))
    assert window.take().totals == {"short": 1.0, "long": 2.0}    # from the first reading to the last
    window.add(3.0, Reading({"short": 2, "long": 110}, source="gateways"))
    assert window.take().totals == {"short": 0.0, "long": 6.0}    # from the last decision's last reading
    window.add(4.0, Reading({"short": 2, "long": 111}, source="gateways"))
    window.add(5.0, unknown("GatewayUnreachable", "pod g-1", "gateways"))
    assert window.take().reason == "GatewayUnreachable"
    window.add(6.0, Reading({"short": 2, "long": 120}, source="gateways"))
    assert window.take().reason == "NoSamples"   # after a failure the rate starts from a new reading
    window.add(8.0, Reading({"short": 4, "long": 120}, source="gateways"))
    assert window.take().totals == {"short": 1.0, "long": 0.0}


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:1", "prometheus:9090", "http://prometheus..svc:9090"])
def test_a_prometheus_that_cannot_be_asked_is_unknown_pressure_not_an_exception(url):
    # The spec refuses such URLs; one from an older operator's spec must still not crash the loop.
    reading = query_prometheus(url, "up", 0.0, 10.0, timeout_s=1.0)
    assert not reading.known and reading.reason == "PrometheusUnreachable" and url in reading.message


# What a template with an empty value renders: the CRD's pattern lets them through, and the HTTP
# client refused them only when connecting (`..`: a UnicodeError escaped the loop, which logged a
# traceback every 5 s while the cluster said nothing).
@pytest.mark.parametrize(("url", "says"), [
    ("http://:9090", "names no host"),
    ("http://user@:9090", "names no host"),
    ("http://prometheus..monitoring:9090", "host 'prometheus..monitoring' needs 1 to 63"),
    ("http://" + "p" * 64 + ".monitoring:9090", "needs 1 to 63 characters"),
])
def test_a_prometheus_url_without_a_usable_host_is_an_invalid_spec(url, says):
    with pytest.raises(InvalidSpecError, match=r"^spec\.monitoring\.prometheusURL: .*" + re.escape(says)):
        parse_spec({"model": {"name": "m", "path": "/m"}, "monitoring": {"prometheusURL": url}})


@pytest.mark.parametrize("url", ["http://[::1]:9090", "http://user:pw@prom:9090", "http://prom.monitoring.svc.:9090",
                                 "https://prom.example.com/prometheus/"])
def test_usable_prometheus_urls_pass(url):
    assert parse_spec({"model": {"name": "m", "path": "/m"}, "monitoring": {"prometheusURL": url}})
