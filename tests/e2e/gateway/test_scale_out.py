"""Two gateway processes over the same emulated engines route by the engines' own load: what one
gateway queued on a prefill pod, the other sees (through the pod's /get_load) and avoids, though
it never dispatched anything there itself."""
from __future__ import annotations

import sys

import httpx
import pytest
import yaml

from tests.support.fixtures_gateway import ChildProcess, RawRequest, poll
from tests.support.metrics_text import metric_value

# Prefill takes 2 ms per token: a 4,000-token prompt holds its pod for 8 s; "hello" takes ~0.
PROFILE = {
    "name": "scale-out-test", "description": "for tests", "provenance": "synthetic",
    "model": {"name": "emulated-test", "kv_bytes_per_token": 1},
    "engine": {"kv_capacity_tokens": 65536, "page_size": 16, "context_length": 16384,
               "max_running_requests": 64, "max_prefill_tokens": 16384},
    "prefill": {"overhead_s": 0.001, "per_token_s": 0.002},
    "decode": {"overhead_s": 0.001},
    "transfer": {"latency_s": 0.0, "bytes_per_s": 1.0e12},
}
LONG_PROMPT = list(range(1000, 5000))   # token ids: counted exactly by gateway and engine


@pytest.fixture
def gateways():
    started: list[ChildProcess] = []

    def start(*flags: str) -> str:
        child = ChildProcess([sys.executable, "-m", "laps_agent.cli", "gateway", "--host", "127.0.0.1",
                              "--port", "0", "--log-level", "warning", *flags])
        started.append(child)
        url = child.read_line_starting("laps gateway listening on").rsplit(" ", 1)[-1]
        poll(lambda: _ready(url), timeout=30, message=f"gateway {url} ready")
        return url

    yield start
    for child in started:
        child.kill()
        child.proc.stdout.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/health").status_code == 200
    except httpx.HTTPError:
        return False


def _prefilled(engine_url: str) -> float:
    """Requests the engine has prefilled (the sum of its prefill batch sizes)."""
    return metric_value(httpx.get(engine_url + "/metrics").text,
                        "laps_engine_prefill_batch_size_sum", 0.0)


def _engine_load_seen(gateway: str, pod_url: str) -> dict | None:
    pods = httpx.get(gateway + "/laps_status").json()["groups"]["short"]["pods"]
    return next(p["engine_load"] for p in pods if p["url"] == pod_url)


def test_a_second_gateway_avoids_the_pod_the_first_one_loaded(engine_launcher, smollm2_engine_model,
                                                              gateways, tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    emulated = ("--backend", "emulated", "--profile", str(profile))
    pod_a = engine_launcher(smollm2_engine_model, "prefill", emulated)
    pod_b = engine_launcher(smollm2_engine_model, "prefill", emulated)
    decode = engine_launcher(smollm2_engine_model, "decode", emulated)
    poll_fast = ("--engine-load-interval", "0.05")
    first = gateways("--prefill-short", pod_a.url, "--decode", decode.url, *poll_fast)
    second = gateways("--prefill-short", f"{pod_a.url},{pod_b.url}", "--decode", decode.url, *poll_fast)

    held = [RawRequest(first, "/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 1})
            for _ in range(2)]
    try:
        # The engine reports the work, queued or in the batch now running...
        poll(lambda: httpx.get(pod_a.url + "/get_load").json()["pending_tokens"] == 2 * len(LONG_PROMPT),
             message="pod A to report both long prompts")
        load = httpx.get(pod_a.url + "/get_load").json()
        assert (load["role"], load["waiting_requests"]) == ("prefill", 2)
        # ... and the second gateway, which dispatched nothing there, sees it.
        poll(lambda: (_engine_load_seen(second, pod_a.url) or {}).get("tokens", 0) > 0,
             message="the second gateway to see pod A's load")
        for i in range(6):
            reply = httpx.post(second + "/v1/completions",
                               json={"prompt": f"hello {i}", "max_tokens": 2}, timeout=30)
            assert reply.status_code == 200, reply.text
        assert _prefilled(pod_b.url) == 6   # every one of them went to the idle pod
        assert _prefilled(pod_a.url) <= 2   # (the first gateway's two, once their batch ends)
    finally:
        for request in held:
            request.hang_up()
