"""Local-mode discovery: a membership file edited while the gateway runs moves traffic, and
engines join only once they answer /get_server_info."""
from __future__ import annotations

import socket

import httpx

from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
from tests.support.fixtures_gateway import poll


def test_membership_file_changes_take_effect(stub_engines, gateway_server, tmp_path):
    a, engine_a = stub_engines("prefill", bootstrap_port=7101)
    b, engine_b = stub_engines("prefill", bootstrap_port=7102)
    decode, _ = stub_engines("decode")
    path = tmp_path / "membership.json"
    StaticSpec((a.url,), (b.url,), (decode.url,)).write(path)
    discovery = StaticDiscovery(file=path, poll_s=0.05)
    gateway = gateway_server(discovery)
    assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"}).status_code == 200
    # The gateway relays decode's answer without waiting for these stubs (no shared KV
    # hand-off) to log the prefill call, so the prefill side's record is polled for.
    poll(lambda: len(engine_a.requests) == 1, message="the short pod to record the request")

    StaticSpec((b.url,), (a.url,), (decode.url,)).write(path)
    poll(lambda: [e.url for e in discovery.membership().groups["short"]] == [b.url],
         message="the edited file to be read")
    assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"}).status_code == 200
    poll(lambda: len(engine_b.requests) == 1, message="the new short pod to record the request")
    assert len(engine_a.requests) == 1

    path.write_text("{ broken")  # a bad edit keeps the last good membership
    assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"}).status_code == 200
    poll(lambda: len(engine_b.requests) == 2, message="the last good membership to be used")


def test_engine_joins_once_it_answers(stub_engines, gateway_server):
    from laps_agent.serving.listen import ServerThread
    from tests.support.stub_engine import StubEngine

    decode, _ = stub_engines("decode")
    with socket.socket() as reserved:  # a port nothing listens on yet
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
    late_url = f"http://127.0.0.1:{port}"
    discovery = StaticDiscovery(StaticSpec((late_url,), (), (decode.url,)), poll_s=0.05)
    gateway = gateway_server(discovery, wait_ready=False)
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"})
    assert reply.status_code == 503 and "retry-after" in reply.headers
    assert httpx.get(f"{gateway.url}/laps_status").json()["groups"]["short"]["pods"] == []

    with ServerThread(StubEngine("prefill", bootstrap_port=7103), port=port):
        poll(lambda: discovery.membership().groups["short"], message="the late engine to join")
        assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"}).status_code == 200
        pod = httpx.get(f"{gateway.url}/laps_status").json()["groups"]["short"]["pods"][0]
        assert pod["bootstrap_port"] == 7103
