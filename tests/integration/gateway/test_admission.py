"""Admission control through the gateway, on stub engines whose long prefill the test holds: a
long group at its pending-token bound refuses long requests at once (429 + Retry-After, never
sent to an engine) while short requests are served; 0 turns the bound off."""
from __future__ import annotations

import threading

import httpx
import pytest

from tests.support.fixtures_gateway import RawRequest, poll

_sent = iter(range(10**6))


def long_body() -> dict:
    """~120 estimated tokens: long at threshold 64. Each one different: a repeat would be
    expected to hit the prefix cache of the pod that got it (cache affinity), i.e. short work."""
    return {"prompt": f"request {next(_sent)}: " + "word " * 100}
SHORT = {"prompt": "hi"}


@pytest.fixture
def held_long_group(stub_engines, gateway_server):
    """start(bound) -> (gateway, long stub engine, gate): the long prefill finishes only once
    `gate` is set; decode waits for the KV of its room, so held requests stay pending."""
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
    from tests.support.stub_engine import KVHandoff

    gate, held = threading.Event(), []

    def start(bound: int, held_longs: int = 2, **config):
        handoff = KVHandoff()
        short, _ = stub_engines("prefill", bootstrap_port=9001, handoff=handoff)
        long_, long_engine = stub_engines("prefill", bootstrap_port=9002, handoff=handoff, prefill_gate=gate)
        decode, _ = stub_engines("decode", handoff=handoff)
        gateway = gateway_server(StaticDiscovery(StaticSpec((short.url,), (long_.url,), (decode.url,)), poll_s=0.05),
                                 length_threshold=64, max_pending_tokens_per_pod=bound, **config)
        for n in range(1, held_longs + 1):   # one at a time: each finds the ones before it held
            held.append(RawRequest(gateway.url, "/v1/completions", long_body()))
            poll(lambda n=n: len(long_engine.requests) == n, message=f"{n} long requests held in prefill")
        return gateway, long_engine

    yield start, gate
    gate.set()
    for request in held:
        request.hang_up()


def _status(gateway) -> dict:
    return httpx.get(f"{gateway.url}/laps_status").json()


def test_a_full_long_group_sends_long_requests_to_an_idle_short_pod(held_long_group):
    """The groups are a preference (policy/placement.py): with the long pod over its bound and
    the short pod idle, a long request is served there, not refused nor queued behind."""
    start, gate = held_long_group
    gateway, long_engine = start(bound=100, held_longs=1)   # one ~120-token request: over the bound
    reply = httpx.post(f"{gateway.url}/v1/completions", json=long_body())
    assert reply.status_code == 200, reply.text
    assert len(long_engine.requests) == 1   # not the held pod
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'laps_gateway_fallbacks_total{class="long"} 1.0' in metrics
    assert 'laps_gateway_rejected_total{class="long"} 0.0' in metrics


def test_a_full_long_group_refuses_long_requests_at_once_and_serves_short_ones(held_long_group):
    """The least-loaded router (the baselines') keeps each class in its group: a full long
    group refuses long work while the short group serves."""
    start, gate = held_long_group
    gateway, long_engine = start(bound=150, router="least-loaded")  # two ~120-token requests fill it
    long_group = _status(gateway)["groups"]["long"]
    assert long_group["max_pending_tokens"] == 150 and long_group["pending_tokens"] >= 150
    reply = httpx.post(f"{gateway.url}/v1/completions", json=long_body())
    assert reply.status_code == 429, reply.text
    assert int(reply.headers["retry-after"]) >= 1
    error = reply.json()["error"]
    assert error["type"] == "overloaded_error"
    assert error["message"].startswith("the long prefill group is overloaded")
    assert len(long_engine.requests) == 2  # the refused request never reached the engine
    for _ in range(5):  # the short class is unaffected
        assert httpx.post(f"{gateway.url}/v1/completions", json=SHORT).status_code == 200
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'laps_gateway_rejected_total{class="long"} 1.0' in metrics
    assert 'laps_gateway_rejected_total{class="short"} 0.0' in metrics
    # Demand counts every arrival, the refused one too (what the planner sizes the pools for).
    assert 'laps_gateway_arrivals_total{class="long"} 3.0' in metrics
    assert 'laps_gateway_arrivals_total{class="short"} 5.0' in metrics
    assert 'laps_gateway_arrival_tokens_total{class="short",kind="output"} 0.0' in metrics   # no max_tokens asked
    reply = httpx.post(f"{gateway.url}/v1/completions", json={**SHORT, "max_tokens": 7})
    assert reply.status_code == 200
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'laps_gateway_arrival_tokens_total{class="short",kind="output"} 7.0' in metrics
    assert 'laps_gateway_errors_total{reason="overloaded"} 1.0' in metrics
    gate.set()  # the held ones finish: the group drains and takes long requests again
    poll(lambda: _status(gateway)["groups"]["long"]["pending_tokens"] == 0, message="the long group to drain")
    assert httpx.post(f"{gateway.url}/v1/completions", json=long_body()).status_code == 200


def test_a_bound_of_zero_admits_everything(held_long_group):
    start, gate = held_long_group
    gateway, long_engine = start(bound=0, router="least-loaded")   # its class's pod, however full
    assert _status(gateway)["groups"]["long"]["max_pending_tokens"] is None
    third = RawRequest(gateway.url, "/v1/completions", long_body())
    try:
        poll(lambda: len(long_engine.requests) == 3, message="a third long request to reach the engine")
    finally:
        gate.set()
        third.hang_up()
