"""A real prefill engine is killed while the gateway serves a run of requests: not one request
is lost. No byte of a prefill engine's answer ever reaches a client (the decode engine's does),
so every attempt the kill broke is retried on the surviving engine, and every request succeeds."""
from __future__ import annotations

import asyncio
import json

import httpx

from tests.support.fixtures_engines import TINY_ENGINE_ARGS
from tests.support.fixtures_gateway import poll


async def test_killing_a_prefill_engine_loses_no_request(engine_launcher, tiny_engine_model,
                                                         gateway_server):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    victim = engine_launcher(tiny_engine_model, "prefill", TINY_ENGINE_ARGS)
    survivor = engine_launcher(tiny_engine_model, "prefill", TINY_ENGINE_ARGS)
    decode = engine_launcher(tiny_engine_model, "decode", TINY_ENGINE_ARGS)
    discovery = StaticDiscovery(StaticSpec((victim.url, survivor.url), (), (decode.url,)))
    gateway = gateway_server(discovery, served_model_name="test-model")
    poll(lambda: len(discovery.membership().groups["short"]) == 2, message="both prefill engines")
    total, outcomes = 24, []

    async def one(client: httpx.AsyncClient, i: int) -> str:
        body = {"model": "test-model", "prompt": f"story number {i}", "max_tokens": 4,
                "stream": i % 2 == 1}
        try:
            reply = await client.post("/v1/completions", json=body)
        except httpx.HTTPError as exc:
            return f"vanished: {exc!r}"
        if reply.status_code != 200:
            return f"failed {reply.status_code}: {reply.text}"
        if not body["stream"]:
            return "ok" if reply.json()["choices"][0]["text"] is not None else reply.text
        events = [e[6:] for e in reply.text.split("\n\n") if e.startswith("data: ")]
        if events and events[-1] == "[DONE]" and not any("error" in json.loads(e) for e in events[:-1]):
            return "ok"
        return f"cut: {reply.text}"

    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:
        gate = asyncio.Semaphore(4)

        async def limited(i: int) -> None:
            async with gate:
                outcomes.append(await one(client, i))
                if len(outcomes) == total // 3:
                    victim.process.kill()

        await asyncio.gather(*(limited(i) for i in range(total)))
        after = [await one(client, total + i) for i in range(4)]
    assert len(outcomes) == total
    assert outcomes == ["ok"] * total, [o for o in outcomes if o != "ok"]
    assert after == ["ok"] * 4  # retried around / ejected: the survivor serves everything
