"""Overload of one class stays that class's problem (emulated engines, the real PD protocol):
- long requests beyond what every prefill pod takes in time are refused at once (429 +
  Retry-After, before any engine sees them) while every short request is served, no pod is ejected, and both classes
  are served again once the load stops;
- a prefill pod that never hands its KV over (decode engine's bootstrap timeout) is the prefill
  group's failure: the client hears which group is overloaded and the decode pod stays routable.
Every request is counted: each ends as a success or as an error with a clear status and message."""
from __future__ import annotations

import asyncio

import httpx
import pytest
import yaml

from tests.support.emulated_profiles import synthetic_profile
from tests.support.metrics_text import metric_value as _metric
from tests.support.refusals import admission_refusal
from tests.support.waiting import poll

# Prefill costs 1 ms per token (a 1000-token prompt: 1 s, a 20-token one: 25 ms); no waiting
# window, so a lone short request never waits for company.
PROFILE = synthetic_profile("slow-long", served="overload-test", engine={"kv_capacity_tokens": 262144},
                            prefill={"per_token_s": 0.001}, transfer={"latency_s": 0.001})
LONG_TOKENS, SHORT_TOKENS, BOUND_PER_POD = 1000, 20, 2500  # the long group takes 3 at a time



def _body(tokens: int, i: int) -> dict:
    # Token ids: the gateway counts them exactly, so which side of the bound a request falls
    # on is arithmetic, not an estimate.
    return {"model": "overload-test", "prompt": [1000 + (i + t) % 500 for t in range(tokens)],
            "max_tokens": 4, "stream": i % 2 == 1}


async def _send(client: httpx.AsyncClient, tokens: int, i: int) -> str:
    """'ok', '429' (checked: Retry-After and a message naming the group), or what went wrong."""
    body = _body(tokens, i)
    try:
        reply = await client.post("/v1/completions", json=body)
    except httpx.HTTPError as exc:
        return f"vanished: {exc!r}"
    if reply.status_code == 429:
        return admission_refusal(reply, "no prefill pod would prefill this long request in time")
    if reply.status_code != 200:
        return f"{reply.status_code}: {reply.text}"
    if not body["stream"]:
        return "ok" if reply.json()["choices"][0]["text"] else f"empty: {reply.text}"
    events = [e[6:] for e in reply.text.split("\n\n") if e.startswith("data: ")]
    return "ok" if events and events[-1] == "[DONE]" and "error" not in reply.text else f"cut: {reply.text}"


@pytest.fixture
def slow_long_stack(laps_local, tmp_path):
    path = tmp_path / "slow-long.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    return laps_local("--engine", "emulated", "--profile", str(path), "--prefill", "2", "--decode", "1",
                      "--no-allocation", "--max-pending-tokens-per-pod", str(BOUND_PER_POD),
                      "--wait-window-ms", "0", timeout=180)


async def test_a_saturated_prefill_fleet_refuses_long_requests_while_short_ones_are_served(slow_long_stack):
    stack = slow_long_stack
    status = httpx.get(stack.base + "/laps_status").json()
    assert status["groups"]["long"]["max_pending_tokens"] == BOUND_PER_POD
    prefill_engines = [p["url"] for g in status["groups"].values() for p in g["pods"]]
    longs: list[str] = []
    shorts: list[str] = []
    async with httpx.AsyncClient(base_url=stack.base, timeout=120) as client:
        # A burst of long requests: they fill the long group's bound, then the short pod's (the
        # groups are a preference), then the rest are refused.
        burst = [asyncio.ensure_future(_send(client, LONG_TOKENS, i)) for i in range(10)]
        await asyncio.to_thread(poll, lambda: sum(t.done() for t in burst) >= 3,
                                message="the burst's requests beyond the bound to be refused")
        # Meanwhile the short class is served, with long requests still arriving beside it.
        for i in range(12):
            short, long_ = await asyncio.gather(_send(client, SHORT_TOKENS, i),
                                                _send(client, LONG_TOKENS, 100 + i))
            shorts.append(short)
            longs.append(long_)
        longs += await asyncio.gather(*burst)
        assert shorts == ["ok"] * 12
        assert set(longs) <= {"ok", "429"}, longs  # none vanished, every failure a clear 429
        assert "429" in longs and "ok" in longs
        # The refused ones never reached an engine: the engines saw only the admitted ones.
        served = sum(_metric(httpx.get(url + "/metrics").text, "laps_engine_ttft_seconds_count", **{"class": "long"})
                     for url in prefill_engines)
        assert served == longs.count("ok")
        # Once the load stops, both classes are served again.
        poll(lambda: httpx.get(stack.base + "/laps_status").json()["groups"]["long"]["pending_tokens"] == 0,
             timeout=60, message="the long group to drain")
        after = await asyncio.gather(_send(client, LONG_TOKENS, 200), _send(client, SHORT_TOKENS, 201))
        assert after == ["ok", "ok"]
    status = httpx.get(stack.base + "/laps_status").json()
    pods = [p for g in status["groups"].values() for p in g["pods"]] + status["decode"]["pods"]
    assert all(p["healthy"] for p in pods)  # overload ejected nothing
    metrics = httpx.get(stack.base + "/metrics").text
    assert _metric(metrics, "laps_gateway_rejected_total", **{"class": "long"}) == longs.count("429")
    assert _metric(metrics, "laps_gateway_rejected_total", **{"class": "short"}) == 0
    assert _metric(metrics, "laps_gateway_errors_total", reason="overloaded") == longs.count("429")
