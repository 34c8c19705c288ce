"""Admission by the engines' measured prefill speed (gateway/admission.py, engine/load_report.py),
on `laps local --engine emulated` with a slow prefill: a burst of long prompts that the token
bound alone would all admit (and whose back would wait out the KV hand-off timeout, then fail
with 503) gets served up to what the long pod prefills in time, and a fast 429 beyond it; the
short class is served throughout."""
from __future__ import annotations

import concurrent.futures
import time

import httpx
import openai
import pytest
import yaml

from tests.support.emulated_profiles import synthetic_profile
from tests.support.waiting import poll

# 2 ms per prompt token: a 400-token prompt prefills in ~0.8 s; 8 of them queue 6.4 s, past the
# 4 s hand-off timeout below, while the token bound (16384 per pod) would take them all.
SLOW = synthetic_profile("slow-cpu", served="slow", prefill={"overhead_s": 0.01, "per_token_s": 0.002})
TIMEOUT_S = 4
LONG = " ".join(["data"] * 400)   # past the 256-token threshold


@pytest.fixture
def slow_stack(laps_local, tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(SLOW))
    return laps_local("--engine", "emulated", "--profile", str(path), "--prefill", "2", "--decode", "1",
                      "--bootstrap-timeout", str(TIMEOUT_S), "--no-allocation", timeout=120)


def test_a_first_burst_past_what_the_long_pod_prefills_in_time_gets_429_at_once_not_503_late(slow_stack):
    client = openai.OpenAI(base_url=slow_stack.url, api_key="unused", timeout=60, max_retries=0)
    # A cold cluster: no request has run yet. The long pod measured its prefill speed at start-up
    # and reports what it can prefill within half its hand-off timeout; the gateway admits to that
    # pod by it from the first burst on.
    status_url = slow_stack.base + "/laps_status"

    def measured() -> int | None:
        # engine_load is null until the gateway's first poll of the pod has come back.
        load = httpx.get(status_url).json()["groups"]["long"]["pods"][0]["engine_load"] or {}
        return load.get("max_pending_tokens")

    poll(lambda: measured() is not None, message="the gateway sees the long pod's measured capacity")
    assert 800 <= measured() <= 1100   # ~2 s of prefill at 2 ms per token (plus the overhead)

    def send(i: int, prompt: str) -> tuple[int, float, str]:
        started = time.monotonic()
        try:
            client.completions.create(model="slow", prompt=f"{i} {prompt}", max_tokens=2)
            return 200, time.monotonic() - started, ""
        except openai.APIStatusError as error:
            return error.status_code, time.monotonic() - started, error.message

    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        longs = [pool.submit(send, i, LONG) for i in range(8)]
        short = pool.submit(send, 99, "hello")
        results = [f.result() for f in longs]
    codes = sorted(code for code, _, _ in results)
    assert 503 not in codes and 504 not in codes, results
    # ~2 s fit 2 of the ~0.8 s prefills (a third would end past them); the rest are refused.
    assert codes.count(200) >= 2 and codes.count(429) >= 3, results
    refused = [message for code, _, message in results if code == 429]
    assert all("measured speed" in message for message in refused), refused
    assert short.result()[0] == 200
    client.close()
