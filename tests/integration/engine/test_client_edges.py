"""An engine used directly (no gateway in front): clients that hang up while uploading, or stop
sending their body, a prompt big enough to take the tokenizer a while, and requests no route
takes must not disturb the engine or its neighbours, and get a clear OpenAI-shaped answer."""
from __future__ import annotations

import dataclasses
import gzip
import json
import threading

import httpx
import pytest

from tests.integration.engine.helpers import client_disconnects, wait_for
from tests.support.fixtures_gateway import RawRequest, stalled_body_message


def test_hanging_up_mid_upload_is_a_quiet_client_disconnect(tiny_mixed_engine):
    """uvicorn logged "Exception in ASGI application" with a traceback for every client that
    gave up while still sending its prompt (a timeout, a cancelled call): noise in the logs that
    reads as an engine bug. It is a client disconnect, counted as one."""
    before = client_disconnects(tiny_mixed_engine)
    log_from = len(tiny_mixed_engine.log_tail(10**9))
    for path in ("/generate", "/v1/completions"):
        body = {"text": "a long prompt " * 200} if path == "/generate" else {"prompt": "words " * 300}
        RawRequest(tiny_mixed_engine.url, path, body, sent=100).hang_up()
    wait_for(lambda: client_disconnects(tiny_mixed_engine) == before + 2, message="both hang-ups counted")
    ok = httpx.post(tiny_mixed_engine.url + "/generate",
                    json={"text": "still here?", "sampling_params": {"max_new_tokens": 2}}, timeout=60)
    assert ok.status_code == 200, ok.text
    logged = tiny_mixed_engine.log_tail(10**9)[log_from:]
    assert "Exception in ASGI application" not in logged and "Traceback" not in logged, logged


class _GatedTokenizer:
    """The engine's tokenizer, except that encoding a long text waits for the test's `gate`:
    a tokenizer busy with a big prompt for as long as the test needs, whatever the machine."""

    def __init__(self, inner, long_chars: int) -> None:
        self._inner, self._long = inner, long_chars
        self.encoding, self.gate = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _hold(self, text: str) -> None:
        if len(text) >= self._long:
            self.encoding.set()
            self.gate.wait(60)  # bounded: a failing test must still end

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self._hold(text)
        return self._inner.encode(text, add_special_tokens)

    def encode_unlocked(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self._hold(text)
        return self._inner.encode_unlocked(text, add_special_tokens)


def test_the_engine_answers_health_and_other_requests_while_a_big_prompt_is_tokenized(tiny_engine_model):
    """Tokenizing ran on the event loop: a client sending megabytes of text (directly; the
    gateway caps bodies) froze /health, /get_load and every other request of the engine for
    as long as the tokenizer took, seconds, enough for probes to fail."""
    from laps_agent.engine.cli import build, build_parser
    from laps_agent.engine.http.server import TOKENIZE_INLINE_MAX
    from laps_agent.serving.listen import ServerThread

    server, engine = build(build_parser().parse_args(
        ["--model", str(tiny_engine_model), "--torch-threads", "1", "--labels-file", "/nonexistent"]))
    tokenizer = _GatedTokenizer(server.tokenizer, TOKENIZE_INLINE_MAX)
    server.tokenizer = tokenizer
    engine.start()
    answers: list[httpx.Response] = []
    try:
        with ServerThread(server.app) as http:
            big = threading.Thread(target=lambda: answers.append(httpx.post(
                http.url + "/generate", timeout=120,
                json={"text": "x" * (TOKENIZE_INLINE_MAX + 1), "sampling_params": {"max_new_tokens": 1}})))
            big.start()
            try:
                wait_for(tokenizer.encoding.is_set, message="the big prompt being tokenized")
                assert httpx.get(http.url + "/health", timeout=10).status_code == 200
                assert httpx.get(http.url + "/get_load", timeout=10).status_code == 200
                small = httpx.post(http.url + "/generate", timeout=30,
                                   json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
                assert small.status_code == 200, small.text
                assert not answers  # all that while, the big prompt was still being tokenized
            finally:
                tokenizer.gate.set()
                big.join(120)
        assert answers and answers[0].status_code in (200, 400), answers
    finally:
        engine.stop()


@pytest.mark.parametrize("method, path, status, message", [
    ("GET", "/v1/completions", 405, "method GET is not allowed on /v1/completions (allowed: POST)"),
    ("POST", "/v1/models", 405, "method POST is not allowed on /v1/models (allowed: GET)"),
    ("POST", "/v1/embeddings", 404, "Invalid URL (POST /v1/embeddings): no such endpoint"),
])
def test_unknown_paths_and_methods_are_openai_shaped(tiny_mixed_engine, method, path, status, message):
    """FastAPI's `{"detail": "Not Found"}` reached the `openai` client as an error with no
    message, unlike every other error of the engine."""
    reply = httpx.request(method, tiny_mixed_engine.url + path, json={}, timeout=10)
    assert reply.status_code == status, reply.text
    assert message in reply.json()["error"]["message"]
    assert reply.json()["error"]["code"] == status
    if status == 405:
        assert reply.headers["allow"] == message.rsplit("allowed: ", 1)[1].rstrip(")")


def test_a_compressed_body_is_415_naming_the_encoding(tiny_mixed_engine):
    """It was a 400 "malformed JSON body: 'utf-8' codec can't decode byte 0x8b", which does not
    say that the engine takes no compressed bodies."""
    raw = gzip.compress(json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 1}}).encode())
    reply = httpx.post(tiny_mixed_engine.url + "/generate", content=raw, timeout=10,
                       headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert reply.status_code == 415, reply.text
    assert "Content-Encoding 'gzip' is not supported" in reply.json()["error"]["message"]


def test_a_body_that_stops_arriving_is_408_and_the_engine_serves_on(tiny_engine_model):
    """A body shorter than its Content-Length (a broken proxy or client) held its request and
    connection forever: nothing bounds a body read in uvicorn. Now: 408 naming what came, the
    connection closed, the other requests served meanwhile."""
    from laps_agent.emulated.build import build_emulated as build
    from laps_agent.engine.flags import build_parser
    from laps_agent.serving.listen import ServerThread

    server, engine = build(build_parser().parse_args(
        ["--backend", "emulated", "--model", str(tiny_engine_model), "--labels-file", "/nonexistent"]))
    server.settings = dataclasses.replace(server.settings, body_idle_timeout_s=0.5)
    engine.start()
    try:
        with ServerThread(server.app) as http:
            stalled = RawRequest(http.url, "/generate", {"text": "hi " * 50}, sent=20)
            ok = httpx.post(http.url + "/generate", timeout=30,
                            json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
            assert ok.status_code == 200, ok.text
            answer = stalled.answer_to_eof()   # after 0.5 s; the engine closes the connection
    finally:
        engine.stop()
    message = stalled_body_message(*answer)
    assert "stopped arriving: 20 bytes of the" in message and "nothing for 0.5s" in message
