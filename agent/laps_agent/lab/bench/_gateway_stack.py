"""Processes of `laps bench gateway`: emulated engines and gateways on loopback, each a child
process whose CPU time is read from /proc (so the gateway's own cost per request is measured,
not inferred from latency)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx

from laps_agent.emulated.engine import FILLER_WORDS
from laps_agent.local.engines import free_ports
from laps_agent.local.signals_deferred import SignalsDeferred

_TICKS = os.sysconf("SC_CLK_TCK")
_SCHEDSTAT = os.path.exists("/proc/self/schedstat")


@dataclass
class Child:
    proc: subprocess.Popen
    url: str
    urls: tuple[str, ...] = ()   # a process serving several (the stub upstreams: prefill, decode)

    def cpu_seconds(self) -> float:
        """CPU time of the process's threads, from schedstat in nanoseconds (/proc/PID/stat
        counts 10 ms ticks: too coarse for a few dozen requests of about a millisecond)."""
        if not _SCHEDSTAT:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime
        total = 0
        for task in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                with open(f"/proc/{self.proc.pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:
                continue  # a thread that just ended
        return total / 1e9

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _started(argv: list[str], ready: Callable[[subprocess.Popen], Child], **popen) -> Child:
    """The child `ready` returns once it serves. A Ctrl-C, or a failure, while it starts stops
    it: kept out of the caller's list until started, it was left running (`kill -INT` on the
    benchmark alone; a terminal's Ctrl-C reaches the whole process group)."""
    proc = None
    try:
        with SignalsDeferred():   # a child forked is one this function stops
            proc = subprocess.Popen(argv, **popen)
        return ready(proc)
    except BaseException:   # KeyboardInterrupt included: the deferred one too
        if proc is not None:
            Child(proc, "").stop()
        raise


def word_tokenizer(directory: Path, words: Iterable[str]) -> Path:
    """A Hugging Face tokenizer directory: one token per whitespace-separated word (`words` and
    the emulated engine's filler words; anything else is one unknown token). The engines
    tokenize every prompt, prefill and decode alike; with SmolLM2's tokenizer that is ~13 ms
    per 40 KiB prompt and engine, which on a small machine makes the engines, not the gateway,
    what the benchmark measures. This one takes ~4 ms."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = ["[UNK]", "<|endoftext|>", *sorted({w for w in words if w} | {w.strip() for w in FILLER_WORDS})]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return directory


def spawn_engine(role: str, tokenizer: Path, profile: str = "instant") -> Child:
    port, boot = free_ports(2)

    def ready(proc: subprocess.Popen) -> Child:
        child = Child(proc, f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(child.url + "/health", trust_env=False).status_code == 200:
                    return child
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # poll interval, bounded by the deadline
        raise RuntimeError(f"emulated {role} engine did not start (rc={proc.poll()})")

    return _started([sys.executable, "-m", "laps_agent.cli", "engine", "--backend", "emulated",
                     "--profile", profile, "--model", str(tokenizer), "--role", role,
                     "--host", "127.0.0.1", "--port", str(port), "--bootstrap-port", str(boot),
                     "--labels-file", "/nonexistent", "--log-level", "warning",
                     # No batching window: a short prompt would wait up to 5 ms for
                     # batch-mates, which is scheduling, not HTTP path.
                     "--wait-window-ms", "0"], ready, stdout=subprocess.DEVNULL)


def spawn_gateway(prefill: str, decode: str, *extra: str) -> Child:
    """`laps gateway` over one prefill engine (both groups) and one decode engine; returns once
    it routes."""
    def ready(proc: subprocess.Popen) -> Child:
        for line in proc.stdout:
            if "listening on" in line:
                child = Child(proc, line.strip().rsplit(" ", 1)[-1])
                _wait_ready(child)
                return child
        raise RuntimeError(f"laps gateway exited before listening (rc={proc.wait()})")

    return _started([sys.executable, "-m", "laps_agent.cli", "gateway", "--host", "127.0.0.1",
                     "--port", "0", "--prefill-short", prefill, "--prefill-long", prefill,
                     "--decode", decode, "--log-level", "warning",
                     # Measures cost, not overload: 32 clients of 40 KiB bodies pass
                     # the default admission bound.
                     "--max-pending-tokens-per-pod", "0", *extra],
                    ready, stdout=subprocess.PIPE, text=True)


def _wait_ready(child: Child, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(child.url + "/health", trust_env=False).json().get("ready"):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)  # poll interval, bounded by the deadline
    raise RuntimeError(f"gateway at {child.url} never became ready")


def spawn_stub_upstreams() -> Child:
    """The compute-free prefill and decode upstreams of the scale-out phase (_stub_upstream.py),
    one process; `urls` is (prefill, decode)."""
    def ready(proc: subprocess.Popen) -> Child:
        line = proc.stdout.readline()
        if not line.startswith("stub upstreams on ports"):
            raise RuntimeError(f"stub upstreams did not start (rc={proc.poll()})")
        urls = tuple(f"http://127.0.0.1:{port}" for port in line.split()[-2:])
        return Child(proc, urls[0], urls)

    return _started([sys.executable, "-m", "laps_agent.lab.bench._stub_upstream"], ready,
                    stdout=subprocess.PIPE, text=True)
