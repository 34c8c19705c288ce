"""An engine's /get_load says how many requests of each gateway class it holds, from their
arrival to the end of their answer (emulated backend, the real HTTP server): every gateway
replica reads it, so that a class's decode share counts the other replicas' requests too."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from tests.integration.engine.helpers import engine_state
from tests.support.emulated_profiles import synthetic_profile
from tests.support.waiting import poll

STEP_S = 0.05   # a decode step: a 40-token answer is held ~2 s
PROFILE = synthetic_profile("held-test", engine={"max_running_requests": 8}, prefill={"overhead_s": 0.001},
                            decode={"overhead_s": STEP_S})


@pytest.fixture
def engine(engine_launcher, tiny_engine_model, tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    return engine_launcher(tiny_engine_model, "mixed", ("--backend", "emulated", "--profile", str(path),
                                                        "--wait-window-ms", "0"))


def _held(engine) -> dict:
    return httpx.get(engine.url + "/get_load", timeout=10).json()["held_by_class"]


def _complete(url: str, cls: str | None, stream: bool, tokens: int = 40) -> int:
    headers = {"X-LAPS-Class": cls} if cls else {}
    body = {"prompt": "held", "max_tokens": tokens, "stream": stream, "ignore_eos": True}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60).status_code


def test_get_load_counts_the_requests_held_per_gateway_class_until_their_answer_ends(engine):
    assert _held(engine) == {"short": 0, "long": 0}
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(_complete, engine.url, "long", True), pool.submit(_complete, engine.url, "long", False),
                 pool.submit(_complete, engine.url, "short", True),
                 pool.submit(_complete, engine.url, None, True)]      # not the gateway's: no class
        poll(lambda: engine_state(engine)["state"]["live"] == 4, message="all four requests held")
        assert _held(engine) == {"short": 1, "long": 2}
        # A value that is no class is refused (400) and held nowhere.
        assert _complete(engine.url, "medium", False) == 400
        assert [c.result() for c in calls] == [200] * 4
    assert _held(engine) == {"short": 0, "long": 0}   # streamed or not, counted to the last byte


def test_a_request_whose_client_hangs_up_mid_stream_stops_counting(engine):
    body = {"prompt": "held", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", engine.url + "/v1/completions", json=body,
                      headers={"X-LAPS-Class": "long"}, timeout=60) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines()   # kept: a dropped iterator closes the stream
        next(lines)                  # the answer has begun
        assert _held(engine) == {"short": 0, "long": 1}
    poll(lambda: _held(engine)["long"] == 0, message="the hung-up request to stop counting")
