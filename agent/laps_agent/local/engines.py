"""Engine child processes of `laps local`: spawn with a labels file, wait until loaded, stop
without orphans."""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from laps_agent.engine.flags import build_parser  # torch-free: the engine's flags alone

_PR_SET_PDEATHSIG = 1
PROGRESS_EVERY_S = 5.0   # how often the loading of the engines is said


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports free now. Each socket is held until all are chosen: closed
    one by one, the kernel may hand a port out twice, and laps local once gave two of its 8
    prefill engines one port (the second failed to start: Address already in use)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class EngineChild:
    name: str
    role: str
    group: str | None
    url: str
    process: subprocess.Popen
    log_path: Path
    labels_path: Path
    told_to_stop: bool = False   # stop_all sent it SIGTERM while it ran

    @property
    def stopped_cleanly(self) -> bool:
        """Exited 0, or by the SIGTERM it was sent before it could handle one (Ctrl-C while the
        engines load: the default action ends a process still importing). Anything else, its
        log may say why."""
        code = self.process.returncode
        return code == 0 or (self.told_to_stop and code == -signal.SIGTERM)

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


def _running(children: list[EngineChild]) -> list[EngineChild]:
    return [c for c in children if c.process.poll() is None]   # poll() also reaps


def stop_all(children: list[EngineChild], say: Callable[[str], None], grace_s: float = 15.0) -> bool:
    """SIGTERM every engine at once, then SIGKILL whichever is still there after `grace_s`, or at
    once on a second Ctrl-C or SIGTERM: the user asked to stop now, as the gateway's drain does,
    rather than for a traceback and engines still draining. Returns whether it came to that (a
    second signal, and engines still there to kill).

    From here on a signal only sets a flag, and stays harmless until the process exits. As
    KeyboardInterrupt it could land anywhere: between saying "stopping" and the first SIGTERM
    (a traceback, and engines left running), or inside Popen's own code, whose wait lock it can
    leave held, and then wait() never returned (CI saw `laps local` hang there)."""
    interrupted = False

    def on_signal(signum, frame) -> None:
        nonlocal interrupted
        interrupted = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    say("stopping engines… (Ctrl-C again: stop at once)")   # only once a Ctrl-C is a flag
    for child in _running(children):
        child.told_to_stop = True
        child.process.terminate()
    deadline = time.monotonic() + grace_s
    while not interrupted and _running(children) and time.monotonic() < deadline:
        time.sleep(0.05)   # a signal cuts it short: its handler runs as the sleep wakes
    stubborn = _running(children)
    for child in stubborn:
        child.process.kill()
    # SIGKILL is not refused, even by a stopped process: this waits for the kernel, boundedly,
    # so a process that cannot be reaped here (init reaps it after we exit) cannot hang the exit.
    reaped_by = time.monotonic() + 5.0
    while _running(children) and time.monotonic() < reaped_by:
        time.sleep(0.01)
    return interrupted and bool(stubborn)


def engine_flag(engine_args: list[str], dest: str):
    """The value every engine takes for one of its flags (its default when not given), from the
    flags `laps local` passes on (already checked by unknown_engine_args)."""
    return getattr(build_parser().parse_known_args(engine_args)[0], dest)


def shared_gpu_args(device: str, engine_args: list[str], engines: int) -> tuple[list[str], str | None]:
    """Engines that share one CUDA device split its memory. Each sizes its KV pool from
    --mem-fraction of the memory free when it looks, and engines starting together all see the
    same free memory: three taking 85% of it each ran the third out of memory. So each gets
    1/engines of the fraction, and one that looks after another allocated takes less, never more.
    Returns the flags to add after the engine flags, and a line to say; nothing on CPU, for one
    engine, or when --kv-pages sizes the pools."""
    if device == "cpu" or engines < 2 or engine_flag(engine_args, "kv_pages"):
        return [], None
    total = engine_flag(engine_args, "mem_fraction")
    each = total / engines
    where = "the CUDA device" if device == "cuda" else "one device (if CUDA)"
    return (["--mem-fraction", repr(each)],
            f"{engines} engines share {where}: each KV pool takes {each:.3g} of the free "
            f"device memory (--mem-fraction {total:g} / {engines})")


def unknown_engine_args(engine_args: list[str], command: str = "laps local") -> str | None:
    """What in the flags `command` (`laps local`, `laps sim`) passes on is not a `laps engine`
    flag either (a typo, a flag of another command), or a bad value of one, as one line; None
    when every engine will take them. Checked before any engine starts or model is built: each
    would otherwise refuse them later, behind the engine's whole usage text."""
    # lazy: the engine's server module (fastapi), wanted only when engine flags are checked
    from laps_agent.engine.http.serve import check_server_flags

    parser = build_parser()
    parser.exit_on_error = False  # a bad value raises, rather than printing usage and exiting
    try:
        parsed, unknown = parser.parse_known_args(engine_args)
    except argparse.ArgumentError as err:
        return f"engine flags: {err}"
    if unknown:
        return f"unrecognized arguments: {' '.join(unknown)} (neither {command}'s flags nor laps engine's)"
    try:
        check_server_flags(parsed)   # a value every engine would refuse (--kv-pages -1)
    except ValueError as err:
        return f"engine flags: {err}"
    return None


def wait_until_loaded(children: list[EngineChild], timeout: float, say: Callable[[str], None]) -> None:
    """Until every engine answers /health, saying each one ready and, every few seconds, who is
    still loading; RuntimeError (with the log's tail) when one exits or the time is up."""
    started = time.monotonic()
    last_progress = started
    pending = list(children)
    with httpx.Client(timeout=2.0, trust_env=False) as http:
        while pending:
            for child in list(pending):
                if child.process.poll() is not None:
                    raise RuntimeError(f"{child.name} exited with {child.process.returncode}; "
                                       f"last lines of {child.log_path}:\n{child.log_tail()}")
                try:
                    ready = http.get(child.url + "/health").status_code == 200
                except httpx.HTTPError:
                    ready = False
                if ready:
                    pending.remove(child)
                    say(f"{child.name} ready ({time.monotonic() - started:.1f}s) at {child.url}")
            now = time.monotonic()
            if pending and now - last_progress >= PROGRESS_EVERY_S:
                last_progress = now
                say(f"loading the model… {now - started:.0f}s, waiting for "
                     + ", ".join(c.name for c in pending))
            if pending and now - started > timeout:
                raise RuntimeError(f"engines not ready after {timeout:.0f}s: "
                                   + ", ".join(c.name for c in pending))
            time.sleep(0.2)  # poll interval, bounded by the timeout above


def served_name(children: list[EngineChild], given: str | None) -> str:
    """The model name the gateway serves: the one given, else the engines' own."""
    if given:
        return given
    info = httpx.get(children[0].url + "/get_server_info", timeout=10, trust_env=False).json()
    return info.get("served_model_name") or "default"
