"""Readiness (`/health`: can this gateway route at all) and liveness (`/live`: the process
serves), the paths the gateway Deployment's probes use."""
from __future__ import annotations

import httpx

from tests.support.waiting import poll


def test_ready_and_live_with_a_prefill_and_a_decode_pod(pd_stack):
    gateway, _ = pd_stack()
    health = httpx.get(f"{gateway.url}/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok", "ready": True})
    live = httpx.get(f"{gateway.url}/live")
    assert (live.status_code, live.json()) == (200, {"status": "ok"})


def test_not_ready_says_why_but_stays_live(gateway_server):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    # Nothing listens on this port, so discovery never admits the pod.
    gateway = gateway_server(StaticDiscovery(StaticSpec(("http://127.0.0.1:9",), (), ())),
                             wait_ready=False)
    health = httpx.get(f"{gateway.url}/health")
    assert health.status_code == 503
    body = health.json()
    assert (body["status"], body["ready"]) == ("unavailable", False)
    assert "no prefill pod discovered" in body["reason"] and "no decode pod discovered" in body["reason"]
    assert httpx.get(f"{gateway.url}/live").status_code == 200


def test_a_gateway_missing_only_decode_pods_is_not_ready(stub_engines, gateway_server):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    prefill, _ = stub_engines("prefill")
    discovery = StaticDiscovery(StaticSpec((prefill.url,), (), ("http://127.0.0.1:9",)), poll_s=0.05)
    gateway = gateway_server(discovery, wait_ready=False)
    poll(lambda: discovery.membership().groups["short"], message="the prefill pod discovered")
    health = httpx.get(f"{gateway.url}/health")
    assert health.status_code == 503 and health.json()["reason"] == "no decode pod discovered"
