"""Graceful drain of `laps engine` (emulated backend, the real HTTP server and PD protocol): on
SIGTERM it is unready at once, refuses new work with 503 `draining`, finishes what it holds
(streams, and a prefill engine's KV hand-offs) and exits 0; at the end of its grace period, or
on a second signal, it exits anyway, ending what it still held cleanly. And its bounded queue:
beyond --max-queued-requests, 503 `queue_full`."""
from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from tests.integration.engine.helpers import engine_state, pd_body, room, sse_events
from tests.support.emulated_profiles import synthetic_profile
from tests.support.second_signal import stop_twice
from tests.support.waiting import poll

PREFILL_S, STEP_S = 0.3, 0.05
PROFILE = synthetic_profile("drain-test", engine={"max_running_requests": 8}, prefill={"overhead_s": PREFILL_S},
                            decode={"overhead_s": STEP_S})


@pytest.fixture
def emulated(engine_launcher, tiny_engine_model, tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE))

    def start(role: str = "mixed", *extra: str):
        return engine_launcher(tiny_engine_model, role, ("--backend", "emulated", "--profile", str(path),
                                                         "--wait-window-ms", "0", *extra))

    return start


def _stream(url: str, body: dict) -> tuple[int, list]:
    """(status, SSE events) of a streamed request; status 0 if the connection broke off."""
    try:
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as reply:
            text = reply.read().decode()
    except httpx.HTTPError:
        return 0, []
    return reply.status_code, sse_events(text) if reply.status_code == 200 else [text]


def _completed(result: tuple[int, list], tokens: int) -> bool:
    status, events = result
    return (status == 200 and events[-1] == "[DONE]"
            and sum(1 for e in events[:-1] if e["choices"][0]["text"]) == tokens)


def _sigterm(engine) -> float:
    engine.process.send_signal(signal.SIGTERM)
    return time.monotonic()


def _assert_draining(engine) -> None:
    """Unready at once, and new work refused with a reason a gateway can key on."""
    health = poll(lambda: (r := httpx.get(engine.url + "/health")).status_code == 503 and r,
                  timeout=1.0, message="/health to answer 503 right after SIGTERM")
    assert health.json()["status"] == "draining" and health.json()["error"]["type"] == "draining"
    refused = httpx.post(engine.url + "/v1/completions", json={"prompt": "late", "max_tokens": 2})
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "draining"
    assert "draining" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "1" and refused.headers["connection"] == "close"


def test_sigterm_finishes_the_streams_held_refuses_new_ones_and_exits_0(emulated):
    engine = emulated("mixed", "--drain-grace-s", "30")
    tokens = 30  # ~1.8 s each
    with ThreadPoolExecutor(3) as pool:
        held = [pool.submit(_stream, engine.url + "/v1/completions",
                            {"prompt": f"held {i}", "max_tokens": tokens}) for i in range(3)]
        poll(lambda: engine_state(engine)["state"]["live"] == 3, message="three requests held")
        signalled = _sigterm(engine)
        _assert_draining(engine)
        results = [f.result() for f in held]
    finished = time.monotonic()
    assert all(_completed(r, tokens) for r in results), results
    assert engine.process.wait(10) == 0
    assert time.monotonic() - finished < 2 and time.monotonic() - signalled < 30


def test_at_the_end_of_the_grace_period_the_engine_exits_anyway(emulated):
    engine = emulated("mixed", "--drain-grace-s", "2")
    with ThreadPoolExecutor(1) as pool:
        endless = pool.submit(_stream, engine.url + "/v1/completions",
                              {"prompt": "long", "max_tokens": 400})  # ~20 s
        poll(lambda: engine_state(engine)["state"]["live"] == 1, message="the request held")
        signalled = _sigterm(engine)
        assert engine.process.wait(10) == 0
        exited = time.monotonic() - signalled
        status, events = endless.result()
    assert 1.0 <= exited < 3.5, exited  # the grace period (2 s), plus the exit itself
    # Cut short, the stream still ends cleanly: with an error event saying why.
    assert status == 200 and events[-1]["error"]["type"] == "draining", events[-3:]
    assert "stopped before it finished" in events[-1]["error"]["message"]
    assert "Traceback" not in engine.log_tail(20000)


def test_a_second_signal_stops_at_once_and_ends_what_it_held_cleanly(emulated):
    engine = emulated("mixed", "--drain-grace-s", "30")
    body = {"prompt": "held", "max_tokens": 400}  # ~20 s each
    ended = stop_twice(engine.process, engine.url, body,
                       lambda: engine_state(engine)["state"]["live"] == 2, second=signal.SIGINT)
    # At once: what it held had ~20 s to go, its grace period 30 s (the bound allows for a busy
    # machine's slow exit).
    assert ended.exit_status == 128 + signal.SIGINT and ended.exit_s < 10, ended
    # Not answered yet: an OpenAI-shaped 503 a client (or a gateway) retries elsewhere.
    plain = ended.plain
    assert plain.status_code == 503 and plain.headers["content-type"] == "application/json"
    assert plain.json()["error"]["type"] == "draining" and plain.headers["retry-after"] == "1"
    # Streaming already: its events so far, then an error event, and a transfer that ends cleanly.
    status, events, broken = ended.stream
    assert status == 200 and not broken and events[0]["choices"][0]["text"]
    assert events[-1]["error"]["type"] == "draining" and "[DONE]" not in events, events[-3:]
    assert "Traceback" not in engine.log_tail(20000)


def test_a_draining_prefill_engine_still_hands_its_kv_over(emulated):
    prefill = emulated("prefill", "--drain-grace-s", "30")
    decode = emulated("decode")
    body = pd_body({"prompt": "handed over while draining", "max_tokens": 8}, prefill, room())
    with ThreadPoolExecutor(2) as pool:
        prefilled = pool.submit(_stream, prefill.url + "/v1/completions", body)
        decoded = pool.submit(_stream, decode.url + "/v1/completions", body)
        poll(lambda: engine_state(prefill)["state"]["live"] == 1, message="the prefill under way")
        _sigterm(prefill)
        _assert_draining(prefill)
        assert _completed(decoded.result(), 8)  # its KV came from the draining prefill engine
        assert prefilled.result()[0] == 200
    assert prefill.process.wait(10) == 0


def test_beyond_its_queue_bound_an_engine_answers_503_queue_full(emulated):
    engine = emulated("mixed", "--max-queued-requests", "2", "--max-running-requests", "1")
    tokens = 20  # ~1.3 s each, one at a time
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(_stream, engine.url + "/v1/completions", {"prompt": "a", "max_tokens": tokens})
        poll(lambda: engine_state(engine)["state"]["running"] == 1, message="the first request running")
        queued = [pool.submit(_stream, engine.url + "/v1/completions", {"prompt": p, "max_tokens": tokens})
                  for p in ("b", "c")]
        poll(lambda: engine_state(engine)["queue"] == {"waiting": 2, "bound": 2}, message="two waiting")
        refused = httpx.post(engine.url + "/v1/completions", json={"prompt": "d", "max_tokens": 2})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["type"] == "queue_full"
        assert error["message"].startswith("engine queue full (2 waiting, bound 2)")
        results = [running.result(), *(f.result() for f in queued)]
    assert all(_completed(r, tokens) for r in results), results
    assert httpx.post(engine.url + "/v1/completions", json={"prompt": "e", "max_tokens": 2}).status_code == 200
