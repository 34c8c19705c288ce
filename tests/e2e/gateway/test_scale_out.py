"""Two gateway processes over the same emulated engines route and admit by the engines' own load:
what one gateway queued on a prefill pod, the other sees (through the pod's /get_load) and
avoids, though it never dispatched anything there itself; and the requests one gateway's class
holds on the decode pool count against that class's decode share at the other."""
from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from tests.support.emulated_profiles import synthetic_profile
from tests.support.fixtures_gateway import ChildProcess, RawRequest, poll
from tests.support.metrics_text import metric_value
from tests.support.refusals import admission_refusal

# Prefill takes 2 ms per token: a 4,000-token prompt holds its pod for 8 s; "hello" takes ~0.
PROFILE = synthetic_profile("scale-out-test", served="emulated-test", model={"kv_bytes_per_token": 1},
                            engine={"context_length": 16384, "max_prefill_tokens": 16384},
                            prefill={"overhead_s": 0.001, "per_token_s": 0.002}, decode={"overhead_s": 0.001},
                            transfer={"bytes_per_s": 1.0e12})
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


# ---- the decode share over both gateways -------------------------------------------------------
# One decode engine of 4 slots: a class may hold 3 (the default share, 0.75). A decode step costs
# 20 ms, so a long request's 300-token answer holds its slot for 6 s; prefill is cheap.
SHARE_PROFILE = synthetic_profile("shared-decode-test", served="emulated-test",
                                  engine={"kv_capacity_tokens": 262144, "context_length": 4096, "max_running_requests": 4},
                                  prefill={"overhead_s": 0.002, "per_token_s": 0.0001}, decode={"overhead_s": 0.02},
                                  transfer={"latency_s": 0.001})
SLOTS, SHARE, WAVE = 4, 3, 5
LONG_ANSWER = 300
LONG_ANSWER_S = LONG_ANSWER * SHARE_PROFILE["decode"]["overhead_s"]


def _long(gateway: str, i: int) -> str:
    """'ok', '429' (a refusal naming the decode pool), or what went wrong."""
    prompt = [1000 + (i * 7 + t) % 500 for t in range(1000)]   # token ids: long, exactly
    reply = httpx.post(gateway + "/v1/completions", timeout=60,
                       json={"prompt": prompt, "max_tokens": LONG_ANSWER, "ignore_eos": True})
    if reply.status_code == 429:
        return admission_refusal(reply, "the long class is overloaded in the decode pool")
    return "ok" if reply.status_code == 200 else f"{reply.status_code}: {reply.text}"


def _short_ttft(gateway: str, i: int) -> float:
    started = time.monotonic()
    with httpx.stream("POST", gateway + "/v1/completions", timeout=60,
                      json={"prompt": f"hi {i}", "max_tokens": 4, "stream": True}) as reply:
        assert reply.status_code == 200, reply.read().decode()
        lines = reply.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        ttft = time.monotonic() - started
        rest = [line for line in lines if line.startswith("data: ")]
    assert '"error"' not in first and rest[-1] == "data: [DONE]", rest
    return ttft


def _decode_status(gateway: str) -> dict:
    return httpx.get(gateway + "/laps_status").json()["decode"]


def test_a_long_flood_split_over_two_gateways_gets_the_decode_share_of_both_together(
        engine_launcher, smollm2_engine_model, gateways, tmp_path):
    """Each gateway alone would let the long class hold 3 of the 4 slots: 6 long requests on 4
    slots, and short requests wait behind them for a long answer (6 s). Counted over both
    gateways, the long class holds 3 in all and a slot stays free for short requests."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(SHARE_PROFILE))
    emulated = ("--backend", "emulated", "--profile", str(profile), "--wait-window-ms", "0")
    short, long_ = (engine_launcher(smollm2_engine_model, "prefill", emulated) for _ in range(2))
    decode = engine_launcher(smollm2_engine_model, "decode", emulated)
    flags = ("--prefill-short", short.url, "--prefill-long", long_.url, "--decode", decode.url,
             "--engine-load-interval", "0.05", "--max-pending-tokens-per-pod", "0")
    first, second = gateways(*flags), gateways(*flags)
    for gateway in (first, second):
        poll(lambda gateway=gateway: _decode_status(gateway)["slots"] == SLOTS, message="the decode slots known")

    with ThreadPoolExecutor(2 * WAVE) as pool:
        wave = [pool.submit(_long, first, i) for i in range(WAVE)]
        # The first gateway admits its share and refuses the rest at once.
        poll(lambda: sum(f.done() for f in wave) == WAVE - SHARE, timeout=LONG_ANSWER_S / 3,
             message="the first gateway to refuse the long requests beyond the share")
        # The second one, which sent nothing yet, sees them through the decode engine's report...
        poll(lambda: _decode_status(second)["held"]["long"] == SHARE,
             message="the second gateway to count the first one's long requests")
        # ... so the rest of the flood, sent there, is refused too (at once).
        rest = [pool.submit(_long, second, WAVE + i) for i in range(WAVE)]
        poll(lambda: all(f.done() for f in rest), timeout=LONG_ANSWER_S / 3,
             message="the second gateway to refuse the rest of the flood")
        assert [f.result() for f in rest] == ["429"] * WAVE
        assert httpx.get(decode.url + "/get_load").json()["held_by_class"] == {"short": 0, "long": SHARE}
        # While the long answers hold their slots, short requests on either gateway are served
        # at once: none waits for a long answer to end.
        ttfts = [_short_ttft(gateway, i) for i, gateway in enumerate((first, second, first, second))]
        assert max(ttfts) < LONG_ANSWER_S / 3, ttfts
        assert _decode_status(first)["held_here"] == {"short": 0, "long": SHARE}
        assert _decode_status(second)["held_here"] == {"short": 0, "long": 0}
        longs = [f.result() for f in wave]
    assert sorted(longs) == ["429"] * (WAVE - SHARE) + ["ok"] * SHARE, longs
    for gateway in (first, second):   # the answers ended: the class holds nothing any more
        poll(lambda gateway=gateway: _decode_status(gateway)["held"] == {"short": 0, "long": 0},
             message="the long class to hold nothing")
