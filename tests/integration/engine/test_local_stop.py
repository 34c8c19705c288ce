"""How `laps local` stops its engines (local_engines.stop_all), against real child processes that
ignore SIGTERM, as an engine stuck in a long batch does: a second Ctrl-C kills them at once,
however soon after "stopping engines" it comes (CI once caught one in the instant between that
line and the first SIGTERM: a traceback, and engines left running); a Ctrl-C while they are
being forked is not lost."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from laps_agent.local.engines import EngineChild, stop_all
from laps_agent.local.signals_deferred import SignalsDeferred

_STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "print('ready', flush=True); time.sleep(120)")


@pytest.fixture
def stubborn_engines(tmp_path):
    """Two children that outlive SIGTERM; the test's own signal handlers restored after."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    children = []
    for i in range(2):
        process = subprocess.Popen([sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline() == "ready\n"   # SIGTERM is ignored from here on
        children.append(EngineChild(f"prefill-{i}", "prefill", "short", "http://127.0.0.1:1", process,
                                    tmp_path / f"prefill-{i}.log", tmp_path / f"prefill-{i}.labels"))
    yield children
    for child in children:
        if child.process.poll() is None:
            child.process.kill()
            child.process.wait()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("second_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_as_stopping_is_said_kills_every_engine_at_once(stubborn_engines, second_signal):
    said = []

    def say(line: str) -> None:
        said.append(line)
        os.kill(os.getpid(), second_signal)   # the user's second Ctrl-C, the moment the line shows

    assert stop_all(stubborn_engines, say, grace_s=60) is True   # killed, not waited 60 s for
    assert said == ["stopping engines… (Ctrl-C again: stop at once)"]
    assert [c.process.returncode for c in stubborn_engines] == [-signal.SIGKILL] * 2


def test_without_a_second_signal_the_grace_runs_out_then_the_engines_are_killed(stubborn_engines):
    assert stop_all(stubborn_engines, lambda line: None, grace_s=0.2) is False   # "stopped", not 130
    assert [c.process.returncode for c in stubborn_engines] == [-signal.SIGKILL] * 2


def test_engines_that_stop_on_sigterm_are_not_killed(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    child = EngineChild("decode-0", "decode", None, "http://127.0.0.1:1", process,
                        tmp_path / "decode-0.log", tmp_path / "decode-0.labels")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert stop_all([child], lambda line: None, grace_s=60) is False
        assert process.returncode == -signal.SIGTERM
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_a_ctrl_c_while_engines_are_forked_comes_after_the_last_is_recorded():
    """As KeyboardInterrupt inside Popen, a Ctrl-C was swallowed by a fork hook ("Exception
    ignored", and laps local went on to serve) or left a forked engine out of the list."""
    handler = signal.getsignal(signal.SIGINT)
    started = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with SignalsDeferred():
                for _ in range(2):
                    os.kill(os.getpid(), signal.SIGINT)   # the user's Ctrl-C, mid-spawn
                    started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        assert len(started) == 2   # both in the list that stop_all stops
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        for process in started:
            process.kill()
            process.wait()
