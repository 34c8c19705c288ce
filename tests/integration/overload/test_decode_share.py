"""A flood of one class does not take the decode pool from the other (emulated engines, the real
PD protocol). The decode engines are shared by both classes: without a bound there, long
requests with long answers prefill quickly, fill every decode slot and then the decode engine's
FIFO queue, and a short request waits until long answers finish (measured: short TTFT from
0.02 s to 14 s p50, then 503 queue_full for both classes). With the decode share a class holds at
most 3/4 of the decode slots: the rest of the flood gets a fast 429 naming the decode pool, and
short requests find a slot free at once."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import yaml

from tests.support.emulated_profiles import synthetic_profile
from tests.support.metrics_text import metric_value as _metric
from tests.support.refusals import admission_refusal
from tests.support.waiting import poll

# One decode engine of 8 slots; prefill is cheap (0.1 ms a token) and a decode step costs 20 ms
# whatever the batch, so a long request's 500-token answer holds its slot for 10 s.
PROFILE = synthetic_profile("slow-decode", served="decode-share-test",
                            engine={"kv_capacity_tokens": 262144, "context_length": 4096, "max_running_requests": 8},
                            prefill={"per_token_s": 0.0001}, decode={"overhead_s": 0.02}, transfer={"latency_s": 0.001})
SLOTS, LONG_SHARE = 8, 6                      # int(0.75 * 8): the default share
LONG_TOKENS, LONG_ANSWER, FLOOD = 1000, 500, 30
SHORT_TOKENS, SHORT_ANSWER = 20, 4
LONG_ANSWER_S = LONG_ANSWER * PROFILE["decode"]["overhead_s"]


def _prompt(tokens: int, i: int) -> list[int]:
    # Token ids: the gateway counts them exactly, so the class is arithmetic, not an estimate.
    return [1000 + (i * 7 + t) % 500 for t in range(tokens)]


async def _long(client: httpx.AsyncClient, i: int) -> str:
    """'ok', '429' (checked: Retry-After and a message naming the decode pool), or what went wrong."""
    body = {"model": "decode-share-test", "prompt": _prompt(LONG_TOKENS, i), "max_tokens": LONG_ANSWER}
    reply = await client.post("/v1/completions", json=body)
    if reply.status_code == 429:
        return admission_refusal(reply, "the long class is overloaded in the decode pool")
    if reply.status_code != 200:
        return f"{reply.status_code}: {reply.text}"
    return "ok" if reply.json()["usage"]["completion_tokens"] == LONG_ANSWER else reply.text


async def _short_ttft(client: httpx.AsyncClient, i: int) -> float:
    body = {"model": "decode-share-test", "prompt": _prompt(SHORT_TOKENS, i), "max_tokens": SHORT_ANSWER,
            "stream": True}
    started = time.monotonic()
    async with client.stream("POST", "/v1/completions", json=body) as reply:
        assert reply.status_code == 200, (await reply.aread()).decode()
        ttft, events = None, []
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                ttft = ttft if ttft is not None else time.monotonic() - started
                events.append(line[6:])
    assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events
    return ttft


@pytest.fixture
def slow_decode_stack(laps_local, tmp_path):
    path = tmp_path / "slow-decode.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    # No prefill bound: the decode pool alone is what the flood overloads here.
    return laps_local("--engine", "emulated", "--profile", str(path), "--prefill", "2", "--decode", "1",
                      "--no-allocation", "--max-pending-tokens-per-pod", "0", "--wait-window-ms", "0",
                      timeout=180)


async def test_a_long_flood_gets_429_beyond_its_decode_share_while_short_requests_find_slots(slow_decode_stack):
    stack = slow_decode_stack
    # The gateway knows the decode pool's slots from the decode engine's load reports.
    decode = poll(lambda: (d := httpx.get(stack.base + "/laps_status").json()["decode"])["slots"] and d,
                  timeout=30, message="the decode engine's slots in /laps_status")
    assert (decode["slots"], decode["max_held_per_class"]) == (SLOTS, LONG_SHARE)
    async with httpx.AsyncClient(base_url=stack.base, timeout=120) as client:
        flood = [asyncio.ensure_future(_long(client, i)) for i in range(FLOOD)]
        # Beyond its share the flood is refused at once, long before any long answer ends.
        await asyncio.to_thread(poll, lambda: sum(t.done() for t in flood) >= FLOOD - LONG_SHARE,
                                timeout=LONG_ANSWER_S / 2,
                                message="the long requests beyond the decode share to be refused")
        status = httpx.get(stack.base + "/laps_status").json()["decode"]
        assert status["held"] == {"short": 0, "long": LONG_SHARE}
        # While the admitted long answers hold their slots, short requests are served at once:
        # none waits for a long answer to end (each takes LONG_ANSWER_S).
        ttfts = [await _short_ttft(client, i) for i in range(5)]
        assert max(ttfts) < LONG_ANSWER_S / 3, ttfts
        assert sum(t.done() for t in flood) == FLOOD - LONG_SHARE  # the long answers still ran
        longs = await asyncio.gather(*flood)
    assert sorted(longs) == ["429"] * (FLOOD - LONG_SHARE) + ["ok"] * LONG_SHARE, longs
    metrics = httpx.get(stack.base + "/metrics").text
    assert _metric(metrics, "laps_gateway_rejected_total", **{"class": "long"}) == FLOOD - LONG_SHARE
    assert _metric(metrics, "laps_gateway_rejected_total", **{"class": "short"}) == 0
    # Once the flood's answers end, the class holds nothing and is admitted again.
    assert httpx.get(stack.base + "/laps_status").json()["decode"]["held"] == {"short": 0, "long": 0}
