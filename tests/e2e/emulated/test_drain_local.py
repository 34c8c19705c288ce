"""Graceful drain under load, in `laps local` with emulated engines, through the official `openai`
client: SIGTERM one engine (a prefill engine, then in a second stack a decode engine) in the
middle of a load. It turns unready at once, every request it holds completes, new ones go to the
other engines (the gateway retries its `draining` refusals elsewhere), the client sees no
failure at all, the engine exits 0 well within its grace period, and `laps local` says so and
takes it out of the gateway's membership."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.support.emulated_profiles import synthetic_profile
from tests.support.waiting import poll_async

TOKENS = 16
GRACE_S = 20.0
WORKERS = 6
# a prefill takes ~0.25 s, an answer ~1 s: every engine holds requests under load
PROFILE = synthetic_profile("drain-test", served="emulated-drain", prefill={"overhead_s": 0.25}, decode={"overhead_s": 0.05},
                            transfer={"bytes_per_s": 1.0e9})


def _engine(stack, name: str) -> tuple[str, int]:
    """(url, pid) of the engine `laps local` named `name`."""
    line = next(line for line in stack.output if f"] {name} ready" in line)
    url = line.split(" at ")[-1].strip()
    port = url.rsplit(":", 1)[1]
    for pid in stack.engines:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"engine" in argv and argv[argv.index(b"--port") + 1].decode() == port:
            return url, pid
    raise AssertionError(f"no process for {name} at {url}")


def _exit_status(stack, name: str) -> int | None:
    """The exit status `laps local` reported for its engine `name` (it watches them, and takes
    one that exited out of the gateway's membership); None while it runs."""
    found = re.search(rf"\] {name} exited with (-?\d+);", "".join(stack.read_output()))
    return int(found.group(1)) if found else None


async def _one(client: openai.AsyncOpenAI, model: str, prompt: str, stream: bool) -> str:
    """'ok', or what went wrong: a complete answer is TOKENS tokens, as the usage says."""
    try:
        if stream:
            chunks = [c async for c in await client.completions.create(
                model=model, prompt=prompt, max_tokens=TOKENS, stream=True,
                stream_options={"include_usage": True})]
            usage = chunks[-1].usage
        else:
            usage = (await client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS)).usage
    except openai.OpenAIError as exc:
        return f"failed: {exc!r}"
    return "ok" if usage is not None and usage.completion_tokens == TOKENS else f"incomplete: {usage}"


@pytest.mark.parametrize("victim", ["prefill-0", "decode-0"])
async def test_sigterm_an_engine_in_the_middle_of_a_load(laps_local, tmp_path, victim):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    # prefill-0 is the short group's only engine (the long one takes its class on fallback);
    # decode-0 is one of two decode engines. --drain-grace-s goes to every engine.
    stack = laps_local("--engine", "emulated", "--profile", str(path), "--prefill", "2", "--decode", "2",
                       "--no-allocation", "--wait-window-ms", "0", "--drain-grace-s", str(GRACE_S),
                       timeout=120)
    url, pid = _engine(stack, victim)
    outcomes: list[str] = []
    stop = asyncio.Event()

    async def load(client: openai.AsyncOpenAI, model: str, worker: int) -> None:
        i = 0
        while not stop.is_set():  # short prompts: the short group, where prefill-0 serves
            outcomes.append(await _one(client, model, f"worker {worker} asks {i}", (worker + i) % 2 == 0))
            i += 1

    async with openai.AsyncOpenAI(base_url=stack.url, api_key="unused", timeout=60, max_retries=0) as client, \
            httpx.AsyncClient(timeout=5) as http:
        model = (await client.models.list()).data[0].id
        workers = [asyncio.create_task(load(client, model, w)) for w in range(WORKERS)]

        async def holds() -> bool:
            return (await http.get(url + "/get_server_info")).json()["state"]["live"] > 0

        await poll_async(holds, 30, f"{victim} to hold requests")
        os.kill(pid, signal.SIGTERM)
        signalled = time.monotonic()

        async def unready():
            reply = await http.get(url + "/health")
            return reply.status_code == 503 and reply.json()

        health = await poll_async(unready, 1.0, f"{victim} to turn unready at once")
        assert health["status"] == "draining"
        async def exited() -> bool:
            return _exit_status(stack, victim) is not None

        await poll_async(exited, GRACE_S, f"{victim} to exit")
        exited_after = time.monotonic() - signalled
        served_before_exit = len(outcomes)

        async def later_requests_served() -> bool:  # only the other engines are left to serve them
            return len(outcomes) >= served_before_exit + 3 * WORKERS

        await poll_async(later_requests_served, 60, "requests after the exit")
        stop.set()
        await asyncio.gather(*workers)
        # Gone from the gateway's membership, as a dead pod's endpoints are on Kubernetes.
        status = (await http.get(stack.base + "/laps_status")).json()
        listed = [p["url"] for g in status["groups"].values() for p in g["pods"]] + \
            [p["url"] for p in status["decode"]["pods"]]
        assert url not in listed and len(listed) == 3, listed

    failures = [o for o in outcomes if o != "ok"]
    assert not failures, failures
    assert _exit_status(stack, victim) == 0 and exited_after < GRACE_S - 2
    log = (stack.workdir / f"{victim}.log").read_text()
    held = re.search(r"SIGTERM: draining (\d+) request\(s\) in flight", log)
    assert held and int(held.group(1)) >= 1, log[-2000:]  # it did hold requests, and finished them:
    assert "drained: no request in flight, exiting" in log and "cancelling" not in log
