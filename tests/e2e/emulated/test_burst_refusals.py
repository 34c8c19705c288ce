"""A burst of short requests through `laps local` on emulated engines (the real PD protocol, the
default predicted-TTFT router): the shorts use the long-group pod too (its dual queue serves
them first), and a request is refused only when no pod it may use is idle: every 429 names a
best pod that holds queued work. Then, the burst gone, everything is served again."""
from __future__ import annotations

import asyncio
import re

import httpx
import yaml

from tests.support.emulated_profiles import synthetic_profile
from tests.support.metrics_text import metric_value

# 1 ms a token: a 100-token short takes about 0.11 s; a pod takes 600 tokens' worth at once.
PROFILE = synthetic_profile("burst", served="burst-test", engine={"kv_capacity_tokens": 262144},
                            prefill={"overhead_s": 0.01, "per_token_s": 0.001}, transfer={"latency_s": 0.001})
SHORT_TOKENS, BOUND_PER_POD, BURST = 100, 600, 40
QUEUED = re.compile(r"the best, \S+, would end its prefill in [0-9.e+-]+ s, (\d+) tokens queued ahead")


def _body(i: int) -> dict:
    # Token ids, each request its own (no shared prefix: no cache affinity in play).
    return {"model": "burst-test", "prompt": [1000 + (7 * i + t) % 900 for t in range(SHORT_TOKENS)],
            "max_tokens": 2}


async def _burst(base: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        return await asyncio.gather(*(client.post("/v1/completions", json=_body(i)) for i in range(BURST)))


def test_a_short_burst_uses_every_pod_and_is_refused_only_where_none_is_idle(laps_local, tmp_path):
    path = tmp_path / "burst.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    stack = laps_local("--engine", "emulated", "--profile", str(path), "--prefill", "2", "--decode", "1",
                       "--no-allocation", "--max-pending-tokens-per-pod", str(BOUND_PER_POD),
                       "--wait-window-ms", "0", timeout=180)
    replies = asyncio.run(_burst(stack.base))
    statuses = [r.status_code for r in replies]
    assert set(statuses) <= {200, 429}, [r.text for r in replies if r.status_code not in (200, 429)]
    assert statuses.count(200) >= 4 and statuses.count(429) >= 1, statuses
    for reply in replies:
        if reply.status_code == 429:
            message = reply.json()["error"]["message"]
            queued = QUEUED.search(message)
            assert queued and int(queued.group(1)) > 0, message   # its best pod was busy, not idle
            assert int(reply.headers["retry-after"]) >= 1
    status = httpx.get(stack.base + "/laps_status").json()
    long_pod = status["groups"]["long"]["pods"][0]["url"]
    served_there = metric_value(httpx.get(long_pod + "/metrics").text, "laps_engine_ttft_seconds_count",
                                **{"class": "short"})
    assert served_there >= 1   # shorts used the long-group pod: the groups are a preference
    gateway = httpx.get(stack.base + "/metrics").text
    assert metric_value(gateway, "laps_gateway_requests_total", **{"class": "short", "group": "long"}) >= 1
    again = asyncio.run(_one_by_one(stack.base, 2))
    assert [r.status_code for r in again] == [200, 200]


async def _one_by_one(base: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        return [await client.post("/v1/completions", json=_body(1000 + i)) for i in range(n)]
