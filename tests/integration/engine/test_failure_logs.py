"""An engine's failure log lines name the request as the client and the gateway know it (its
X-Request-ID), also when the failure comes after the stream's first byte, where the error event
is all the client gets, and when a consumer of the engine's outputs breaks. The emulated engine,
in process, behind its real HTTP server on loopback."""
from __future__ import annotations

import asyncio
import json
import logging
import threading

import httpx
import yaml

from tests.support.emulated_profiles import synthetic_profile


class _FailingPolls:
    """The emulated engine's model, except that its polls raise once `broken` is set: the engine
    loop failing (a bug) while a stream is under way, which fails every request it holds."""

    def __init__(self, inner) -> None:
        self._inner, self.broken = inner, threading.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def poll(self, now: float):
        if self.broken.is_set():
            raise RuntimeError("the model broke")
        return self._inner.poll(now)


def _emulated(model_path, tmp_path, **profile):
    from laps_agent.emulated.build import build_emulated as build
    from laps_agent.engine.flags import build_parser

    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(synthetic_profile("slow-decode", served="test-model", **profile)))
    return build(build_parser().parse_args(["--backend", "emulated", "--profile", str(path), "--model",
                                            str(model_path), "--labels-file", "/nonexistent"]))


def test_a_stream_failing_after_its_first_token_is_logged_with_the_request_id(tiny_engine_model, tmp_path,
                                                                                caplog):
    from laps_agent.serving.listen import ServerThread

    # 1000 tokens at 50 ms a step: the stream is still running when the test breaks the model.
    server, engine = _emulated(tiny_engine_model, tmp_path, decode={"overhead_s": 0.05})
    engine.model = model = _FailingPolls(engine.model)
    caplog.set_level(logging.WARNING, logger="laps_agent")
    body = {"model": "test-model", "prompt": "hello", "max_tokens": 1000, "stream": True}
    try:
        with ServerThread(server.app) as http, httpx.stream(
                "POST", http.url + "/v1/completions", json=body, timeout=60,
                headers={"x-request-id": "client-id-42"}) as reply:
            assert reply.status_code == 200 and reply.headers["x-request-id"] == "client-id-42"
            events = []
            for line in reply.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[len("data: "):]))
                    model.broken.set()   # the first token is out: from now on the engine fails
    finally:
        engine.stop()
    assert "choices" in events[0] and "internal engine error" in events[-1]["error"]["message"], events
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(line.startswith("request client-id-42 failed mid-stream with 500 engine_error: internal engine "
                               "error") for line in logged), logged


def test_an_output_sink_failure_is_logged_with_the_request_id(tiny_engine_model, tmp_path, caplog):
    from laps_agent.engine.core.requests import GenerateWork
    from laps_agent.engine.core.sampling_params import SamplingParams

    _, engine = _emulated(tiny_engine_model, tmp_path)

    async def run() -> None:
        called = asyncio.Event()

        def sink(out) -> None:
            called.set()
            raise RuntimeError("the consumer broke")

        engine.submit(GenerateWork("engine-rid-1", [5, 6, 7], SamplingParams(max_new_tokens=1),
                                   request_id="client-id-7"), sink)
        try:
            await asyncio.wait_for(called.wait(), 30)
        finally:
            engine.stop()

    asyncio.run(run())
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "request client-id-7: output sink failed (engine rid engine-rid-1)" in logged, logged


def test_an_unexpected_engine_error_answers_a_500_carrying_the_request_id(tiny_engine_model, tmp_path):
    """A bug in a route is answered by Starlette's own error middleware, which runs outside any
    middleware an app adds: the id must be given ahead of it, or that 500 goes out without one."""
    from laps_agent.serving.listen import ServerThread

    server, engine = _emulated(tiny_engine_model, tmp_path)

    async def broken(request, kind):
        raise RuntimeError("a bug in the route")

    server.serve = broken
    try:
        with ServerThread(server.app) as http:
            reply = httpx.post(http.url + "/v1/completions", json={"model": "test-model", "prompt": "hi"},
                               headers={"x-request-id": "client-id-500"}, timeout=30)
    finally:
        engine.stop()
    assert reply.status_code == 500
    assert reply.headers["x-request-id"] == "client-id-500"
