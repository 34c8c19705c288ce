"""Engine child processes of `laps local`: spawn with a labels file, stop without orphans."""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EngineChild:
    name: str
    role: str
    group: str | None
    url: str
    process: subprocess.Popen
    log_path: Path
    labels_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _die_with_parent() -> None:
    # Even if `laps local` itself is killed with SIGKILL, its engines get SIGTERM (Linux).
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
    os.setpgrp()  # Ctrl-C goes to `laps local` only, which then stops engines in order


def write_labels(path: Path, role: str, group: str | None) -> None:
    """The same `key="value"` lines the downward API writes in a pod."""
    lines = ['app.kubernetes.io/name="laps"', f'laps.io/role="{role}"']
    if group:
        lines.append(f'laps.io/prefill-group="{group}"')
    tmp = path.with_suffix(path.suffix + ".tmp")  # the engine re-reads it at any time: swap whole
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def spawn_engine(name: str, role: str, group: str | None, *, model: str, workdir: Path,
                 port: int, bootstrap_port: int | None, common_args: list[str]) -> EngineChild:
    labels = workdir / f"{name}.labels"
    write_labels(labels, role, group)
    argv = [sys.executable, "-m", "laps_agent.cli", "engine", "--model", model, "--role", role,
            "--host", "127.0.0.1", "--port", str(port), "--labels-file", str(labels)]
    if bootstrap_port is not None:
        argv += ["--bootstrap-port", str(bootstrap_port)]
    argv += common_args
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return EngineChild(name, role, group, f"http://127.0.0.1:{port}", process, log_path, labels)


def stop_all(children: list[EngineChild], grace_s: float = 15.0) -> bool:
    """SIGTERM every engine at once, then SIGKILL whichever is still there after `grace_s`, or at
    once on a second Ctrl-C or SIGTERM (both arrive as KeyboardInterrupt): the user asked to stop
    now, as the gateway's drain does, rather than for a traceback and engines still draining.
    Returns whether it came to that."""
    for child in children:
        if child.process.poll() is None:
            child.process.terminate()
    deadline = time.monotonic() + grace_s
    try:
        for child in children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        return False
    except KeyboardInterrupt:
        # Yet another signal must not interrupt the killing either: we are leaving anyway.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for child in children:
            if child.process.poll() is None:
                child.process.kill()
        for child in children:
            child.process.wait()
        return True


def unknown_engine_args(engine_args: list[str], command: str = "laps local") -> str | None:
    """What in the flags `command` (`laps local`, `laps sim`) passes on is not a `laps engine`
    flag either (a typo, a flag of another command), or a bad value of one, as one line; None
    when every engine will take them. Checked before any engine starts or model is built: each
    would otherwise refuse them later, behind the engine's whole usage text."""
    from laps_agent.engine.cli import build_parser  # torch-free

    parser = build_parser()
    parser.exit_on_error = False  # a bad value raises, rather than printing usage and exiting
    try:
        _, unknown = parser.parse_known_args(engine_args)
    except argparse.ArgumentError as err:
        return f"engine flags: {err}"
    return (f"unrecognized arguments: {' '.join(unknown)} (neither {command}'s flags nor laps engine's)"
            if unknown else None)
