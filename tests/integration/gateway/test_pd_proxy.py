"""The gateway in front of stub PD engines on loopback: protocol, routing, streaming, status."""
from __future__ import annotations

import json

import httpx

from laps_agent.policy.classes import CLASSES
from tests.support.metrics_text import metric_value as _metric


def test_non_streaming_completion_pairs_prefill_and_decode(pd_stack):
    gateway, engines = pd_stack()
    reply = httpx.post(f"{gateway.url}/v1/completions",
                       json={"model": "stub-model", "prompt": "hi", "max_tokens": 3, "foo": 1})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == "ok ok ok"
    (prefill,) = engines["short"].requests
    (decode,) = engines["decode"].requests
    assert prefill["room"] == decode["room"]
    assert decode["bootstrap_host"] == "127.0.0.1" and decode["bootstrap_port"] == 9001
    assert not engines["long"].requests


def test_long_prompt_goes_to_the_long_group(pd_stack):
    gateway, engines = pd_stack()
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json={
        "model": "stub-model", "messages": [{"role": "user", "content": "word " * 400}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]
    assert len(engines["long"].requests) == 1 and not engines["short"].requests
    assert engines["decode"].requests[0]["bootstrap_port"] == 9002
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert _metric(metrics, "laps_gateway_requests_total", **{"class": "long", "group": "long"}) == 1


def test_streaming_passes_every_event_through(pd_stack):
    gateway, engines = pd_stack()
    with httpx.stream("POST", f"{gateway.url}/generate",
                      json={"text": "hello", "sampling_params": {"max_new_tokens": 5},
                            "stream": True}) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert [json.loads(e[6:])["text"] for e in events[:-1]] == ["ok"] * 5
    assert engines["short"].requests[0]["room"] == engines["decode"].requests[0]["room"]


def test_status_and_metrics_show_groups_and_drain_to_zero(pd_stack):
    gateway, _ = pd_stack()
    for _ in range(3):
        assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"}).status_code == 200
    status = httpx.get(f"{gateway.url}/laps_status").json()
    assert status["threshold"] == 64
    assert [len(status["groups"][g]["pods"]) for g in CLASSES] == [1, 1]
    assert len(status["decode"]["pods"]) == 1
    assert status["groups"]["short"]["pending_requests"] == 0
    assert status["groups"]["short"]["pods"][0]["bootstrap_port"] == 9001
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert _metric(metrics, "laps_gateway_requests_total", **{"class": "short", "group": "short"}) == 3
    assert _metric(metrics, "laps_gateway_pending_tokens", group="short") == 0
    assert _metric(metrics, "laps_gateway_ttft_seconds_count", **{"class": "short"}) == 3
    assert _metric(metrics, "laps_gateway_request_seconds_count", **{"class": "short"}) == 3


def test_models_and_health(pd_stack):
    gateway, _ = pd_stack()
    models = httpx.get(f"{gateway.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["stub-model"]
    assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok", "ready": True}
