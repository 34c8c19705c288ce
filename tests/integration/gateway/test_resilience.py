"""Failures: dead pods are retried around and ejected (never a pool's last one), killed engines
lose no request that could still be retried, and a client hanging up cancels both upstream calls."""
from __future__ import annotations

import asyncio
import json

import httpx

from laps_agent.gateway.config import ProxyConfig
from tests.support.fixtures_gateway import RawRequest, poll
from tests.support.metrics_text import metric_value


def _static(short=(), long=(), decode=()):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

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
    answer = ["ok"] * 8

    async def one(client: httpx.AsyncClient, i: int) -> str:
        """'ok'; 'cut' for a stream the killed pod had begun (its bytes reached the client, so
        it cannot be retried: it must end with a clear error event); anything else is a loss."""
        body = {"prompt": f"request {i}", "max_tokens": 8, "stream": i % 2 == 0}
        try:
            async with client.stream("POST", "/v1/completions", json=body) as reply:
                raw = (await reply.aread()).decode()
        except httpx.HTTPError as exc:  # the gateway itself must never drop a connection
            return f"vanished: {exc!r}"
        if reply.status_code != 200:  # nothing had reached this client: it should have been retried
            return f"failed {reply.status_code}: {raw}"
        if not body["stream"]:
            return "ok" if json.loads(raw)["choices"][0]["text"] == " ".join(answer) else f"wrong: {raw}"
        events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
        tokens = [json.loads(e)["choices"][0]["text"].strip() for e in events
                  if e != "[DONE]" and "choices" in json.loads(e)]
        if events[-1] == "[DONE]" and tokens == answer:
            return "ok"
        last = json.loads(events[-1]) if events[-1] != "[DONE]" else {}
        if tokens and tokens == answer[:len(tokens)] and "broke off the stream" in last.get("error", {}).get("message", ""):
            return "cut"
        return f"truncated: {raw}"

    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
        gate = asyncio.Semaphore(8)

        async def limited(i: int) -> None:
            async with gate:
                outcomes.append(await one(client, i))
                if len(outcomes) == total // 4:
                    victim.kill()

        await asyncio.gather(*(limited(i) for i in range(total)))
    cut = outcomes.count("cut")
    assert len(outcomes) == total
    assert outcomes.count("ok") == total - cut, [o for o in outcomes if o not in ("ok", "cut")]
    status = httpx.get(f"{gateway.url}/laps_status").json()
    assert {p["url"]: p["healthy"] for p in status["decode"]["pods"]} == {victim_url: False, survivor_url: True}


def test_a_group_whose_every_pod_fails_keeps_one_routable(stub_engines, gateway_server):
    # The decode stub takes a moment, as a real one waits for its KV: so a prefill pod's failure
    # is seen first and the request retried (a stub answering at once would mask it).
    doomed = [stub_engines("prefill")[0] for _ in range(2)]
    long_, long_engine = stub_engines("prefill")
    decode, _ = stub_engines("decode", first_token_delay_s=0.3)
    gateway = gateway_server(_static(short=[d.url for d in doomed], long=[long_.url], decode=[decode.url]),
                             proxy=ProxyConfig(eject_seconds=60, eject_after_failures=1))
    poll(lambda: len(gateway.gateway.discovery.membership().groups["short"]) == 2
         and gateway.gateway.discovery.membership().groups["long"], message="every prefill pod discovered")
    for server in doomed:
        server.stop()  # both short pods gone: connections refused from now on
    for _ in range(8):  # retried onto the long group once the short pods failed the request
        reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"})
        assert reply.status_code == 200, reply.text
    assert len(long_engine.requests) == 8
    short = httpx.get(f"{gateway.url}/laps_status").json()["groups"]["short"]["pods"]
    assert sorted(p["healthy"] for p in short) == [False, True]  # one ejected, never the last
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'laps_gateway_ejections_total{outcome="ejected",pool="short"} 1.0' in metrics
    assert 'laps_gateway_ejections_total{outcome="capped",pool="short"} 0.0' not in metrics


def test_the_decode_pool_never_drops_to_zero_by_ejection(stub_processes, gateway_server):
    _, prefill_url = stub_processes("prefill")
    doomed = [stub_processes("decode") for _ in range(2)]
    gateway = gateway_server(_static(short=[prefill_url], decode=[url for _, url in doomed]),
                             proxy=ProxyConfig(eject_seconds=60, eject_after_failures=1))
    poll(lambda: len(gateway.gateway.discovery.membership().decode) == 2, message="both decoders")
    for child, _ in doomed:
        child.kill()
    for _ in range(6):  # nothing can serve these: each gets a clear error, none vanishes
        reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"})
        assert reply.status_code in (502, 503), reply.text
        assert "decode pod" in reply.json()["error"]["message"]
    decode = httpx.get(f"{gateway.url}/laps_status").json()["decode"]["pods"]
    assert sorted(p["healthy"] for p in decode) == [False, True]
    assert httpx.get(f"{gateway.url}/health").json()["ready"] is True


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


def test_client_hanging_up_mid_upload_is_a_disconnect_not_a_crash(stub_engines, gateway_server, caplog):
    """A client that gives up while still sending its prompt (a timeout, a cancelled call) was
    logged with a traceback and counted as internal_error: a gateway bug to whoever alerts on it."""
    prefill, prefill_engine = stub_engines("prefill")
    decode, decode_engine = stub_engines("decode")
    gateway = gateway_server(_static(short=[prefill.url], decode=[decode.url]))
    request = RawRequest(gateway.url, "/v1/completions", {"prompt": "a long prompt " * 100}, sent=100)
    request.hang_up()

    def errors(reason: str) -> float:
        page = httpx.get(f"{gateway.url}/metrics").text
        return metric_value(page, "laps_gateway_errors_total", 0, reason=reason)

    poll(lambda: errors("client_disconnected") == 1, message="the hang-up counted as a disconnect")
    assert errors("internal_error") == 0
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    assert not prefill_engine.requests and not decode_engine.requests   # nothing half-sent upstream
