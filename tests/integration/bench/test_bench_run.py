"""`laps bench run` against a real `laps local` (gateway + 2 prefill + 1 decode CPU engines on the
seeded tiny model), as a user runs both: the CLI as a subprocess, results checked on disk."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from PIL import Image

from laps_agent.lab.results import load_result
from laps_agent.lab.results.plots import DPI, FIGSIZE
from laps_agent.local.engines import free_ports
from tests.support.fixtures_local import LocalStack

TWO_PHASES = """\
name: tiny-two-phases
seed: 5
threshold: 32
phases:
  - name: short-first
    requests: 7
    arrival: {process: poisson, rate: 30}
    prompt_tokens: {distribution: uniform, min: 4, max: 40}
    output_tokens: {distribution: fixed, value: 3}
  - name: long-later
    requests: 5
    arrival: {process: constant, rate: 30}
    prompt_tokens: {distribution: uniform, min: 20, max: 200}
    output_tokens: {distribution: uniform, min: 2, max: 4}
"""


@pytest.fixture(scope="module")
def local_url(tiny_model_dir, tmp_path_factory):
    """`laps local` on the tiny model; stopped with SIGINT at the end, leaving no process."""
    stack = LocalStack(["--model", str(tiny_model_dir), "--torch-threads", "1"],
                       tmp_path_factory.mktemp("laps-local"))
    try:
        yield stack.wait_ready(180).base
    finally:
        stack.stop()


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laps_agent.cli", "bench", "run", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def test_a_two_phase_workload_against_laps_local(local_url, tiny_model_dir, tmp_path):
    workload = tmp_path / "two.yaml"
    workload.write_text(TWO_PHASES)
    out = tmp_path / "results"
    done = bench(local_url, "--workload", str(workload), "--out", str(out), "--tokenizer", str(tiny_model_dir),
                 "--slo", "short=2,long=5", "--no-progress", "--timeout", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("results.json", "results.md", "ttft_cdf.png", "ttft_timeline.png", "groups_timeline.png"):
        assert (out / name).is_file(), name
        assert str(out / name) in done.stdout
    assert "## tiny-two-phases" in done.stdout and "### phase long-later" in done.stdout

    result = load_result(out)
    records = list(result.records)
    assert result.meta["planned_requests"] == result.meta["sent_requests"] == len(records) == 12
    ok = [r for r in records if r.ok]
    assert len(ok) + sum(not r.ok for r in records) == 12
    assert len(ok) == 12, [r.error for r in records if not r.ok]
    assert [r.phase for r in records] == ["short-first"] * 7 + ["long-later"] * 5
    assert {r.cls for r in records} == {"short", "long"}
    for r in ok:
        # prompts are exact in the served model's tokenizer, and every planned token streamed
        assert r.server_prompt_tokens == r.sent_prompt_tokens == r.prompt_tokens
        assert r.tokens == r.output_tokens and 0 < r.ttft_s <= r.e2e_s
    assert result.timeline and result.timeline[0].pods == {"short": 1, "long": 1}
    for name in ("ttft_cdf", "ttft_timeline", "groups_timeline"):
        with Image.open(out / f"{name}.png") as image:
            assert image.format == "PNG" and image.size == (FIGSIZE[0] * DPI, FIGSIZE[1] * DPI)


async def test_chat_workload_in_process_and_a_stop_cuts_the_run(local_url, tiny_model_dir):
    from laps_agent.lab.bench.run import run_workload
    from laps_agent.lab.workload import parse_workload
    from laps_agent.modelio.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    spec = parse_workload({"name": "chat", "api": "chat", "seed": 1, "phases": [
        {"name": "now", "requests": 4, "arrival": {"process": "constant", "rate": 50},
         "prompt_tokens": {"distribution": "uniform", "min": 20, "max": 120},
         "output_tokens": {"distribution": "fixed", "value": 2}},
        # one request a minute: the run is stopped long before these are due
        {"name": "later", "requests": 5, "arrival": {"process": "constant", "rate": 1 / 60},
         "prompt_tokens": {"distribution": "fixed", "value": 30},
         "output_tokens": {"distribution": "fixed", "value": 2}}]})
    stop = asyncio.Event()
    seen = []

    def on_record(record):
        seen.append(record)
        if len(seen) == 4:
            stop.set()

    result = await run_workload(local_url, spec, tokenizer=tokenizer, timeout=60, stop=stop, on_record=on_record)
    assert result.meta["interrupted"] is True
    assert result.meta["planned_requests"] == 9 and result.meta["sent_requests"] == len(result.records) == 4
    for r in result.records:
        assert r.ok, r.error
        assert r.server_prompt_tokens == r.sent_prompt_tokens == r.prompt_tokens  # chat-templated count
    assert result.meta["api"] == "chat" and result.meta["model"] == tiny_model_dir.name


def test_an_unreachable_url_fails_at_once_with_exit_code_2(tmp_path):
    (port,) = free_ports(1)  # nothing listens there
    started = time.monotonic()
    done = bench(f"http://127.0.0.1:{port}", "--workload", "lmsys-steady", "--out", str(tmp_path / "r"),
                 timeout=60)
    assert done.returncode == 2
    assert f"cannot reach http://127.0.0.1:{port}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
    assert time.monotonic() - started < 60  # bounded by the subprocess timeout anyway: no hang


def test_a_bad_workload_file_fails_with_exit_code_2_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TWO_PHASES.replace("{process: constant, rate: 30}", "{process: constant, rate: 0}"))
    done = bench("http://127.0.0.1:9", "--workload", str(bad))
    assert done.returncode == 2
    assert "bad.yaml: phases[1].arrival.rate: must be > 0" in done.stderr


class _StuckServer:
    """A real HTTP server that lists a model but never answers a completion (a hung engine)."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn) -> None:
        with conn:
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                if head.startswith(b"GET /v1/models"):
                    body = json.dumps({"data": [{"id": "stuck"}]}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
                elif head.startswith(b"GET"):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                else:
                    self.held.append(conn)
                    conn.recv(65536)  # blocks until the client gives up and closes
                    return

    def close(self) -> None:
        self.sock.close()


def test_a_stuck_server_cannot_hang_the_run(tmp_path):
    server = _StuckServer()
    try:
        workload = tmp_path / "w.yaml"
        workload.write_text(TWO_PHASES)
        done = bench(f"http://127.0.0.1:{server.port}", "--workload", str(workload), "--tokenizer", "none",
                     "--timeout", "1", "--max-requests", "3", "--no-progress", "--out", str(tmp_path / "r"))
    finally:
        server.close()
    assert done.returncode == 0, done.stderr
    result = load_result(tmp_path / "r")
    assert len(result.records) == 3
    assert all(r.status == 0 and r.error == "timed out after 1s" for r in result.records)
    assert "no response ×" in done.stdout
