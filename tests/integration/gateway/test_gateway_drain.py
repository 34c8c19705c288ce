"""Graceful drain of `laps gateway`: two gateway processes over the same (emulated) engines, a
load of streams spread over them, then the first one is deleted the Kubernetes way. It turns
unready at once, refuses new requests with 503 `draining`, finishes every stream it holds and
exits 0; a client that, like a Service, sends new requests only to the ready gateways that are
not being deleted sees no failure at all."""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.emulated_profiles import synthetic_profile
from tests.support.fixtures_gateway import ChildProcess
from tests.support.waiting import poll, poll_async

TOKENS = 40      # ~2 s per stream
GRACE_S = 20.0
WORKERS = 4
PROFILE = synthetic_profile("gateway-drain", prefill={"overhead_s": 0.05}, decode={"overhead_s": 0.05})


@pytest.fixture
def gateways(engine_launcher, tiny_engine_model):
    """Two `laps gateway` processes over one emulated prefill and one emulated decode engine."""
    engines = engine_launcher.emulated_pd(tiny_engine_model, PROFILE)
    prefill, decode = engines.prefill, engines.decode
    children = []
    for _ in range(2):
        child = ChildProcess([sys.executable, "-m", "laps_agent.cli", "gateway", "--host", "127.0.0.1",
                              "--port", "0", "--prefill-short", prefill.url, "--decode", decode.url,
                              "--served-model-name", "test-model", "--drain-grace-s", str(GRACE_S),
                              "--log-level", "warning"])
        children.append(child)
        child.url = child.read_line_starting("laps gateway listening on").split()[-1]
        poll(lambda child=child: httpx.get(child.url + "/health").status_code == 200, timeout=30,
             message="the gateway to see its engines")
    yield children
    for child in children:
        child.kill()
        child.proc.stdout.close()


class Service:
    """What a Kubernetes Service gives its clients: new connections go to ready endpoints only
    (readiness polled as the kubelet probes it), round-robin; a pod being deleted leaves the
    endpoints at once (the endpoints controller), while its preStop delay holds its SIGTERM back."""

    def __init__(self, urls: list[str]) -> None:
        self.urls, self.ready, self.terminating = urls, set(urls), set()
        self._turn = 0

    async def probe(self, http: httpx.AsyncClient) -> None:
        while True:
            for url in self.urls:
                try:
                    ok = (await http.get(url + "/health")).status_code == 200
                except httpx.HTTPError:
                    ok = False
                (self.ready.add if ok else self.ready.discard)(url)
            await asyncio.sleep(0.05)  # the probe period

    def pick(self) -> str:
        endpoints = [u for u in self.urls if u in self.ready and u not in self.terminating]
        self._turn += 1
        return endpoints[self._turn % len(endpoints)]


async def _stream(http: httpx.AsyncClient, url: str, prompt: str, streaming: dict[str, int]) -> tuple[str, float]:
    """('ok' | what went wrong, when it ended); `streaming[url]` counts the streams under way."""
    body = {"model": "test-model", "prompt": prompt, "max_tokens": TOKENS, "stream": True}
    began = False
    try:
        async with http.stream("POST", url + "/v1/completions", json=body) as reply:
            if reply.status_code != 200:
                return f"{reply.status_code}: {(await reply.aread()).decode()}", time.monotonic()
            events = []
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if not began:
                        began = True
                        streaming[url] += 1
    except httpx.HTTPError as exc:
        return f"broken: {exc!r}", time.monotonic()
    finally:
        if began:
            streaming[url] -= 1
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
    ok = events[-1] == "[DONE]" and sum(1 for t in texts if t) == TOKENS
    return ("ok" if ok else f"incomplete: {events[-3:]}"), time.monotonic()


async def test_sigterm_drains_a_gateway_behind_a_second_one(gateways):
    first, second = gateways
    service = Service([first.url, second.url])
    streaming = {first.url: 0, second.url: 0}
    results: list[tuple[str, str, float, float]] = []   # (gateway, outcome, started, ended)
    stop = asyncio.Event()

    async def load(http: httpx.AsyncClient, worker: int) -> None:
        i = 0
        while not stop.is_set():
            url, started = service.pick(), time.monotonic()
            outcome, ended = await _stream(http, url, f"worker {worker} asks {i}", streaming)
            results.append((url, outcome, started, ended))
            i += 1

    async with httpx.AsyncClient(timeout=60) as http:
        prober = asyncio.create_task(service.probe(http))
        workers = [asyncio.create_task(load(http, w)) for w in range(WORKERS)]

        async def first_streams() -> bool:
            return streaming[first.url] >= 2

        await poll_async(first_streams, 30, "two streams under way through the first gateway")
        service.terminating.add(first.url)        # the pod is deleted: out of the endpoints...
        first.proc.send_signal(signal.SIGTERM)    # ...and, after its preStop delay, SIGTERM
        signalled = time.monotonic()
        held = streaming[first.url]

        async def unready():
            reply = await http.get(first.url + "/health")
            return reply.status_code == 503 and reply.json()

        health = await poll_async(unready, 1.0, "the first gateway to turn unready at once")
        assert (health["status"], health["ready"]) == ("draining", False)
        late = await http.post(first.url + "/v1/completions", json={"prompt": "late", "max_tokens": 2})
        assert late.status_code == 503 and late.json()["error"]["type"] == "draining"
        assert late.headers["retry-after"] == "1"

        code = await asyncio.to_thread(first.proc.wait, GRACE_S)
        exited_after = time.monotonic() - signalled
        done_at_exit = len(results)

        async def served_after_exit() -> bool:
            return len(results) >= done_at_exit + 2 * WORKERS

        await poll_async(served_after_exit, 60, "requests after the first gateway's exit")
        stop.set()
        await asyncio.gather(*workers)
        prober.cancel()

    assert held >= 2
    failures = [r for r in results if r[1] != "ok"]
    assert not failures, failures
    # Every stream the first gateway held when it was told to go completed before it exited.
    finished_while_draining = [r for r in results if r[0] == first.url and r[3] >= signalled]
    assert len(finished_while_draining) >= held
    assert code == 0 and exited_after < GRACE_S - 2
    assert all(r[0] == second.url for r in results if r[2] >= signalled)  # new ones went elsewhere
    with pytest.raises(subprocess.TimeoutExpired):  # the second one serves on
        second.proc.wait(0.1)
