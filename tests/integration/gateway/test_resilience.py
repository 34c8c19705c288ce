"""Failures: dead pods are retried around and ejected, killed engines lose no request, and a
client hanging up cancels both upstream calls."""
from __future__ import annotations

import asyncio
import json

import httpx

from laps_agent.gateway.config import ProxyConfig

from tests.support.fixtures_gateway import RawRequest, poll


def _static(short=(), long=(), decode=()):
    from laps_agent.gateway.discovery import StaticDiscovery, StaticSpec

    return StaticDiscovery(StaticSpec(tuple(short), tuple(long), tuple(decode)), poll_s=0.05)


def test_dead_prefill_pod_is_retried_elsewhere_then_ejected(stub_processes, gateway_server):
    doomed, doomed_url = stub_processes("prefill")
    _, alive_url = stub_processes("prefill")
    _, decode_url = stub_processes("decode")
    gateway = gateway_server(_static(short=[doomed_url, alive_url], decode=[decode_url]),
                             proxy=ProxyConfig(eject_seconds=60))
    poll(lambda: len(gateway.gateway.discovery.membership().groups["short"]) == 2,
         message="both prefill pods discovered")
    doomed.kill()
    for _ in range(8):
        reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"})
        assert reply.status_code == 200, reply.text
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert "laps_gateway_retries_total 0.0" not in metrics
    pods = httpx.get(f"{gateway.url}/laps_status").json()["groups"]["short"]["pods"]
    health = {p["url"]: p["healthy"] for p in pods}
    assert health == {doomed_url: False, alive_url: True}


async def test_killing_an_engine_mid_run_loses_no_request(stub_processes, gateway_server):
    prefill = [stub_processes("prefill")[1] for _ in range(2)]
    victim, victim_url = stub_processes("decode", "--token-delay", "0.01")
    _, survivor_url = stub_processes("decode", "--token-delay", "0.01")
    gateway = gateway_server(_static(short=prefill, decode=[victim_url, survivor_url]))
    poll(lambda: len(gateway.gateway.discovery.membership().decode) == 2, message="both decoders")
    total, outcomes = 80, []

    async def one(client: httpx.AsyncClient, i: int) -> str:
        body = {"prompt": f"request {i}", "max_tokens": 8, "stream": i % 2 == 0}
        try:
            async with client.stream("POST", "/v1/completions", json=body) as reply:
                raw = (await reply.aread()).decode()
        except httpx.HTTPError as exc:  # the gateway itself must never drop a connection
            return f"vanished: {exc!r}"
        if reply.status_code != 200:
            return "clear error" if json.loads(raw)["error"]["message"] else "unclear error"
        if not body["stream"]:
            return "ok" if json.loads(raw)["choices"][0]["text"] == " ".join(["ok"] * 8) else raw
        events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
        if events[-1] == "[DONE]" and len(events) == 9:
            return "ok"
        return "clear error" if "error" in json.loads(events[-1]) else f"truncated: {raw}"

    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        gate = asyncio.Semaphore(8)

        async def limited(i: int) -> None:
            async with gate:
                outcomes.append(await one(client, i))
                if len(outcomes) == total // 4:
                    victim.kill()

        await asyncio.gather(*(limited(i) for i in range(total)))
    counts = {k: outcomes.count(k) for k in set(outcomes)}
    assert len(outcomes) == total
    assert set(counts) <= {"ok", "clear error"}, counts
    assert counts["ok"] >= total // 2, counts


def test_client_disconnect_cancels_both_upstream_calls(stub_engines, gateway_server):
    prefill, prefill_engine = stub_engines("prefill", prefill_delay_s=30)
    decode, decode_engine = stub_engines("decode", first_token_delay_s=30)
    gateway = gateway_server(_static(short=[prefill.url], decode=[decode.url]))
    request = RawRequest(gateway.url, "/v1/completions", {"prompt": "x"})
    poll(lambda: prefill_engine.requests and decode_engine.requests,
         message="both engines to get the request")
    request.hang_up()
    poll(lambda: prefill_engine.disconnects == 1 and decode_engine.disconnects == 1,
         message="both engines to see the gateway hang up")
    status = httpx.get(f"{gateway.url}/laps_status").json()
    assert status["groups"]["short"]["pending_requests"] == 0
    assert status["decode"]["pods"][0]["pending_requests"] == 0


def test_client_leaving_a_stream_cancels_the_decode_call(stub_engines, gateway_server):
    prefill, _ = stub_engines("prefill")
    decode, decode_engine = stub_engines("decode", token_delay_s=0.5)
    gateway = gateway_server(_static(short=[prefill.url], decode=[decode.url]))
    with httpx.stream("POST", f"{gateway.url}/v1/completions",
                      json={"prompt": "x", "max_tokens": 16, "stream": True}) as reply:
        assert next(reply.iter_lines()).startswith("data: ")
    poll(lambda: decode_engine.disconnects == 1, message="decode engine to see the hang-up")
    poll(lambda: httpx.get(f"{gateway.url}/laps_status").json()["decode"]["pods"][0][
        "pending_requests"] == 0, message="decode pending to drain")
