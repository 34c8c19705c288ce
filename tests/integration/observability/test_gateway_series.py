"""The gateway's latency histograms count each answered request once, and measure as long as a
request may last.

`laps_gateway_ttft_seconds` took a sample whenever an attempt's prefill phase ended: a request
whose decode pod died after its prefill (and was answered by a retry on another pair of pods)
counted two TTFTs, the first one for a token its client never got. Panels reading the sample
rate as throughput, or comparing it with `laps_gateway_request_seconds_count`, were off by every
retry."""
from __future__ import annotations

import threading

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.metrics_text import metric_value
from tests.support.waiting import poll


def _static(short=(), decode=()):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    return StaticDiscovery(StaticSpec(tuple(short), (), tuple(decode)), poll_s=0.05)


def test_a_request_retried_after_its_prefill_is_one_ttft_sample(stub_engines, stub_processes,
                                                                gateway_server):
    prefill, _ = stub_engines("prefill")
    stalled, stalled_url = stub_processes("decode", "--first-token-delay", "60")
    healthy, _ = stub_engines("decode")
    gateway = gateway_server(_static(short=[prefill.url], decode=[stalled_url, healthy.url]))
    poll(lambda: len(gateway.gateway.discovery.membership().decode) == 2, message="both decoders")

    def status() -> dict:
        return httpx.get(f"{gateway.url}/laps_status", timeout=10).json()

    def held_on_stalled_after_prefill() -> bool:
        s = status()
        on_stalled = {p["url"]: p["pending_requests"] for p in s["decode"]["pods"]}[stalled_url]
        return on_stalled == 1 and s["groups"]["short"]["pending_requests"] == 0

    answers: list[int] = []

    def send(i: int) -> None:
        reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": f"request {i}"},
                           timeout=30)
        answers.append(reply.status_code)

    # Routing picks the decode pod; send until one request waits on the stalled one with its
    # prefill phase over (the others are answered by the healthy pod at once).
    sent: list[threading.Thread] = []
    for i in range(20):
        sent.append(threading.Thread(target=send, args=(i,)))
        sent[-1].start()
        poll(lambda: len(answers) == len(sent) or held_on_stalled_after_prefill(),
             message="the request to be answered or held")
        if len(answers) < len(sent):   # held: it stays so for the stalled pod's 60 s
            break
    assert held_on_stalled_after_prefill(), "no request reached the stalled decode pod"
    stalled.kill()   # nothing reached the client yet: retried on the healthy pod
    for thread in sent:
        thread.join(30)
    assert answers == [200] * len(sent)

    page = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert metric_value(page, "laps_gateway_retries_total") == 1
    assert metric_value(page, "laps_gateway_ttft_seconds_count", **{"class": "short"}) == len(sent)
    assert metric_value(page, "laps_gateway_request_seconds_count", **{"class": "short"}) == len(sent)


def test_a_request_as_long_as_the_deadline_allows_is_measured_not_capped():
    """A quantile falling past the last finite bucket reads as that bucket's bound: with buckets
    ending at 300 s, requests of 500 s (the default deadline allows 600) showed as 300 s."""
    from laps_agent.gateway.config import DEFAULT_REQUEST_DEADLINE_S
    from laps_agent.gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics()
    metrics.ttft_of["long"].observe(DEFAULT_REQUEST_DEADLINE_S - 1)
    metrics.request_seconds_of["long"].observe(DEFAULT_REQUEST_DEADLINE_S - 1)
    page = metrics.render().decode()
    for name in ("laps_gateway_ttft_seconds", "laps_gateway_request_seconds"):
        holding = [float(s.labels["le"]) for family in text_string_to_metric_families(page)
                   for s in family.samples if s.name == name + "_bucket"
                   and s.labels["class"] == "long" and s.value == 1]
        assert min(holding) <= DEFAULT_REQUEST_DEADLINE_S, (name, holding)
