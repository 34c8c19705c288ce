"""Real `laps engine` processes on free loopback ports, for engine and gateway tests.

Stable API (the gateway tests build on it):
- `start_engine(model, role="mixed", extra_args=(), ...) -> EngineProcess` / `EngineProcess.stop()`
- fixture `engine_launcher`: function-scoped `launch(model, role=..., extra_args=...)`; every
  engine it started is stopped at teardown (also on failure).
- fixture `engine_launcher_session`: the same, stopped at the end of the session.
- fixture `tiny_engine_model`: path of the tiny random Llama model (the models fixture's
  `tiny_model_dir` when present).
- fixtures `tiny_pd_engines` (session): `PDEngines(prefill, decode)` on the tiny model;
  `tiny_mixed_engine` (session): one `mixed` engine on the tiny model.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import httpx
import pytest

from laps_agent.local.engines import free_ports
from tests.support.waiting import stop_process

# One torch thread per engine: the test machine's 2 cores are shared by everything running.
DEFAULT_ENGINE_ARGS = ("--torch-threads", "1", "--log-level", "info")




@dataclass
class EngineProcess:
    role: str
    port: int
    bootstrap_port: int | None
    process: subprocess.Popen
    log_path: Path
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        stop_process(self.process, signal.SIGTERM, timeout)

    def get_json(self, path: str, **kw) -> dict:
        resp = httpx.get(self.url + path, timeout=kw.pop("timeout", 30.0), **kw)
        resp.raise_for_status()
        return resp.json()


def start_engine(model: str | Path, role: str = "mixed", extra_args: Sequence[str] = (), *,
                 served_model_name: str = "test-model", labels_file: str | Path | None = None,
                 startup_timeout: float = 180.0, log_dir: str | Path | None = None) -> EngineProcess:
    """Start `python -m laps_agent.cli engine` and wait until /health answers 200."""
    port, bootstrap_port = free_ports(2)
    bootstrap_port = bootstrap_port if role == "prefill" else None
    argv = [sys.executable, "-m", "laps_agent.cli", "engine", "--model", str(model), "--role", role,
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_model_name,
            "--labels-file", str(labels_file or "/nonexistent/laps-labels"), *DEFAULT_ENGINE_ARGS]
    if bootstrap_port is not None:
        argv += ["--bootstrap-port", str(bootstrap_port)]
    argv += list(extra_args)
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="laps-engine-"))
    log_path = log_dir / f"engine-{role}-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    engine = EngineProcess(role, port, bootstrap_port, proc, log_path, argv)
    try:
        _wait_healthy(engine, startup_timeout)
    except BaseException:
        engine.stop()
        raise
    return engine


def wait_healthy(url: str, process: subprocess.Popen, log_tail, timeout: float) -> None:
    """Poll `url`/health until 200; fail with the engine's log if it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"engine exited with {process.returncode}:\n{log_tail()}")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine not healthy within {timeout}s:\n{log_tail()}")
        time.sleep(0.1)  # poll interval, bounded by the deadline


def _wait_healthy(engine: EngineProcess, timeout: float) -> None:
    wait_healthy(engine.url, engine.process, engine.log_tail, timeout)


class EngineLauncher:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[EngineProcess] = []

    def __call__(self, model: str | Path, role: str = "mixed", extra_args: Sequence[str] = (), **kw) -> EngineProcess:
        kw.setdefault("log_dir", self.log_dir)
        engine = start_engine(model, role, extra_args, **kw)
        self.started.append(engine)
        return engine

    def emulated_pd(self, model: str | Path, profile: dict) -> PDEngines:
        """A prefill and a decode emulated engine running `profile` (a profile's dict), with no
        batching window: what a test over the gateway times is the profile, not the window."""
        import yaml

        path = self.log_dir / f"profile-{profile['name']}.yaml"
        path.write_text(yaml.safe_dump(profile))
        extra = ("--backend", "emulated", "--profile", str(path), "--wait-window-ms", "0")
        return PDEngines(self(model, "prefill", extra), self(model, "decode", extra))

    def stop_all(self) -> None:
        for engine in reversed(self.started):
            engine.stop()
        self.started.clear()


@dataclass
class PDEngines:
    prefill: EngineProcess
    decode: EngineProcess


@pytest.fixture
def engine_launcher(tmp_path):
    launcher = EngineLauncher(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="session")
def engine_launcher_session(tmp_path_factory):
    launcher = EngineLauncher(tmp_path_factory.mktemp("engines"))
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="session")
def tiny_engine_model(request, tmp_path_factory) -> Path:
    try:
        return Path(request.getfixturevalue("tiny_model_dir"))
    except pytest.FixtureLookupError:
        from tests.support.tiny_model import write_tiny_model

        return write_tiny_model(tmp_path_factory.mktemp("tiny-model") / "tiny", seed=0)


TINY_ENGINE_ARGS = ("--kv-pages", "512", "--bootstrap-timeout", "5")


@pytest.fixture(scope="session")
def tiny_pd_engines(engine_launcher_session, tiny_engine_model) -> PDEngines:
    prefill = engine_launcher_session(tiny_engine_model, "prefill", TINY_ENGINE_ARGS)
    decode = engine_launcher_session(tiny_engine_model, "decode", TINY_ENGINE_ARGS)
    return PDEngines(prefill, decode)


@pytest.fixture(scope="session")
def tiny_mixed_engine(engine_launcher_session, tiny_engine_model) -> EngineProcess:
    return engine_launcher_session(tiny_engine_model, "mixed", TINY_ENGINE_ARGS)


@pytest.fixture(scope="session")
def smollm2_engine_model(request) -> Path:
    try:
        return Path(request.getfixturevalue("smollm2_path"))
    except pytest.FixtureLookupError:
        from laps_agent.engine.model.loader import default_model_path

        return default_model_path()


@pytest.fixture(scope="session")
def smollm2_mixed_engine(engine_launcher_session, smollm2_engine_model) -> EngineProcess:
    """One `mixed` SmolLM2 engine for the whole session (loading takes seconds)."""
    return engine_launcher_session(smollm2_engine_model, "mixed", ("--kv-pages", "128"),
                                   served_model_name="smollm2")
