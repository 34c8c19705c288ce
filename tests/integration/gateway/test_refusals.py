"""Engines that refuse rather than fail: a draining engine's 503 `draining` sends the request to
another pod and takes the engine out of routing without counting as a failure; a full queue's
503 `queue_full` sends it to another pod and leaves the engine as it is; when no pod would take
it the client hears a clear 503 with Retry-After."""
from __future__ import annotations

import logging

import httpx

from laps_agent.gateway.config import ProxyConfig
from tests.support.fixtures_gateway import poll
from tests.support.metrics_text import metric_value


def _static(short=(), long=(), decode=()):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    return StaticDiscovery(StaticSpec(tuple(short), tuple(long), tuple(decode)), poll_s=0.05)


def _two_short_pods(stub_engines, gateway_server, **config):
    (refusing, refusing_engine), (other, other_engine) = stub_engines("prefill"), stub_engines("prefill")
    decode, _ = stub_engines("decode", first_token_delay_s=0.2)  # the prefill answer comes first
    gateway = gateway_server(_static(short=[refusing.url, other.url], decode=[decode.url]), **config)
    poll(lambda: len(gateway.gateway.discovery.membership().groups["short"]) == 2,
         message="both prefill pods discovered")
    return gateway, refusing, refusing_engine, other_engine


def _health(gateway) -> dict[str, bool]:
    pods = httpx.get(f"{gateway.url}/laps_status").json()["groups"]["short"]["pods"]
    return {p["url"]: p["healthy"] for p in pods}


def test_a_draining_engine_s_requests_go_elsewhere_without_a_failure(stub_engines, gateway_server):
    gateway, draining, draining_engine, other_engine = _two_short_pods(
        stub_engines, gateway_server, proxy=ProxyConfig(eject_after_failures=1, eject_seconds=60))
    draining_engine.refusal = "draining"
    for i in range(6):
        reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": f"x{i}"})
        assert reply.status_code == 200, reply.text
    # Refused once, then out of routing: every other request went straight to the other pod.
    assert draining_engine.refused == 1 and len(other_engine.requests) == 6
    assert _health(gateway)[draining.url] is False
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(metrics, "laps_gateway_ejections_total", pool="short", outcome="draining") == 1
    assert metric_value(metrics, "laps_gateway_ejections_total", pool="short", outcome="ejected") == 0
    assert metric_value(metrics, "laps_gateway_retries_total") == 1


def test_a_full_engine_queue_is_retried_elsewhere_and_the_pod_stays_in(stub_engines, gateway_server):
    gateway, full, full_engine, other_engine = _two_short_pods(
        stub_engines, gateway_server, proxy=ProxyConfig(eject_after_failures=1, eject_seconds=60))
    full_engine.refusal = "queue_full"
    for i in range(8):
        reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": f"x{i}"})
        assert reply.status_code == 200, reply.text
    # A busy pod is no failing pod: it is still tried (and refuses), never ejected.
    assert full_engine.refused >= 2 and len(other_engine.requests) == 8
    assert _health(gateway)[full.url] is True
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(metrics, "laps_gateway_ejections_total", pool="short", outcome="ejected") == 0
    full_engine.refusal = None  # room again: it serves
    for i in range(4):
        assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": f"y{i}"}).status_code == 200
    assert len(full_engine.requests) >= 1


def test_when_every_pod_refuses_the_client_gets_503_with_retry_after(stub_engines, gateway_server):
    gateway, _, first, second = _two_short_pods(stub_engines, gateway_server)
    first.refusal = second.refusal = "queue_full"
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"})
    assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    assert "stub refuses: queue_full" in reply.json()["error"]["message"]
    assert httpx.get(f"{gateway.url}/health").json()["ready"] is True  # full is not broken


def test_refusals_under_overload_are_logged_at_debug_not_as_failures(stub_engines, gateway_server, caplog):
    """Under overload every request may be refused (full queues, draining pods, then none left
    to try): a warning each would flood the log, written on the gateway's event loop when its
    latency matters most. A pod that fails (502) is still a warning (test_request_id.py)."""
    caplog.set_level(logging.DEBUG, logger="laps_agent")
    gateway, _, first, second = _two_short_pods(stub_engines, gateway_server)
    first.refusal = second.refusal = "queue_full"
    ids = [f"full-{i}" for i in range(3)]
    for rid in ids:
        reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"}, headers={"x-request-id": rid})
        assert reply.status_code == 503, reply.text
    first.refusal = second.refusal = "draining"
    for rid in ("drain-0", "drain-1"):   # refused by both, then out of routing: no pod to try
        reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"}, headers={"x-request-id": rid})
        assert reply.status_code == 503, reply.text
    ids += ["drain-0", "drain-1"]
    assert "no healthy pod" in reply.json()["error"]["message"]
    ours = [r for r in caplog.records if r.name.startswith("laps_agent.gateway")]
    assert [r.getMessage() for r in ours if r.levelno >= logging.WARNING] == []
    debug = [r.getMessage() for r in ours if r.levelno == logging.DEBUG]
    for rid in ids:   # still said, for whoever looks at debug level
        assert any(f"request {rid} failed with 503" in line for line in debug), (rid, debug)
    assert any("request full-0: attempt 1 failed" in line for line in debug), debug
