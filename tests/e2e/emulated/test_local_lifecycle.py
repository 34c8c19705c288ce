"""`laps local` as a platform engineer first meets it and then scripts it: the `curl` it prints
works as pasted; a bad model file or a mistyped flag is one line before anything starts; when its
only decode engine dies it says so and exits 1 (nothing restarts engines, so serving on would
answer every request 503 for good); a Ctrl-C while the engines load is a clean stop; a second
Ctrl-C while the engines stop kills them at once, without a traceback. Emulated engines: none of this depends on the model's compute."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from laps_agent.local.process import LocalProcess
from tests.support.emulated_profiles import synthetic_profile
from tests.support.waiting import poll

STACK = ["--engine", "emulated", "--profile", "instant", "--prefill", "1", "--decode", "1"]


def _laps_local(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laps_agent.cli", "local", "--port", "0", *args],
                          capture_output=True, text=True, timeout=60)


def _engine_pid(stack: LocalProcess, workdir: Path, name: str) -> int:
    """The process of the engine `laps local` named `name` (its labels file is its own)."""
    labels = str(workdir / f"{name}.labels").encode()
    for pid in stack.engines:
        try:
            if labels in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                return pid
        except OSError:
            continue
    raise AssertionError(f"no process for {name} among {stack.engines}")


def _said(stack: LocalProcess, text: str) -> bool:
    return text in "".join(stack.read_output())


def test_the_printed_curl_works_as_pasted(laps_local):
    stack = laps_local(*STACK, "--served-model-name", "it's-mine")  # a quote the shell must survive
    line = poll(lambda: next((line for line in stack.read_output() if "] try: " in line), None),
                timeout=10, message="the example request")  # printed right after the URL
    argv = shlex.split(line.split("] try: ", 1)[1])  # what a shell makes of the pasted line
    assert argv[0] == "curl"
    headers = dict(argv[i + 1].split(": ", 1) for i, a in enumerate(argv) if a == "-H")
    url = next(a for a in argv if a.startswith("http"))
    reply = httpx.post(url, content=argv[argv.index("-d") + 1], headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "it's-mine" and reply.json()["choices"][0]["message"]["content"]


def test_a_bad_model_file_or_flag_is_one_line_before_anything_starts(tmp_path):
    not_a_model = tmp_path / "notes.gguf"
    not_a_model.write_bytes(b"these are my notes, not a model\n" * 64)
    result = _laps_local("--model", str(not_a_model))
    assert result.returncode == 1
    assert f"cannot read a tokenizer from {not_a_model}: GGUF magic invalid" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr and "starting" not in result.stdout

    typo = _laps_local(*STACK, "--wait-windw-ms", "3")  # passed on to the engines: none takes it
    assert typo.returncode == 2
    assert "unrecognized arguments: --wait-windw-ms 3" in typo.stderr
    assert "starting" not in typo.stdout and "laps engine" in typo.stderr.splitlines()[-1]
    bad_value = _laps_local(*STACK, "--dtype", "bf16")
    assert bad_value.returncode == 2 and "argument --dtype: invalid choice: 'bf16'" in bad_value.stderr


def test_the_last_decode_engine_dying_stops_laps_local_with_status_1_and_its_logs_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))   # where laps local makes its own workdir
    stack = LocalProcess(STACK, None)
    try:
        stack.wait_ready(120)
        [workdir] = tmp_path.glob("laps-local-*")
        os.kill(_engine_pid(stack, workdir, "decode-0"), signal.SIGKILL)
        assert stack.proc.wait(30) == 1
        output = "".join(stack.read_output())
        assert "decode-0 exited with -9; no longer routed to" in output
        assert "error: no decode engine left: nothing can be served" in output
        # A failed run keeps the engines' logs, and says where: they may say why.
        assert f"engine logs kept in {workdir}" in output and (workdir / "decode-0.log").is_file()
        poll(lambda: not stack.leftovers(), timeout=20, message="the prefill engines to be gone")
    finally:
        stack.kill()


def test_an_engine_that_died_while_the_rest_served_on_keeps_the_logs_after_a_clean_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    stack = LocalProcess([*STACK[:-1], "2"], None)   # two decode engines: one can die
    try:
        stack.wait_ready(120)
        [workdir] = tmp_path.glob("laps-local-*")
        os.kill(_engine_pid(stack, workdir, "decode-1"), signal.SIGKILL)
        poll(lambda: _said(stack, "decode-1 exited with -9"), timeout=30, message="the engine's death said")
        stack.proc.send_signal(signal.SIGINT)
        assert stack.proc.wait(60) == 0   # the others drained and stopped cleanly
        assert f"engine logs kept in {workdir}" in "".join(stack.read_output())
        assert (workdir / "decode-1.log").is_file()   # the log its death pointed to
    finally:
        stack.kill()


def test_one_ctrl_c_waits_at_most_drain_grace_s_and_a_clean_stop_leaves_no_temp_dir(tmp_path, monkeypatch):
    """--drain-grace-s, passed on to the engines, bounds the gateway's drain too: a stream far
    longer than it is cut with an error event after it (the gateway waited its own 30 s before),
    and the exit is a clean 0 that removes laps local's own temp dir."""
    profile = tmp_path / "slow.yaml"
    profile.write_text(yaml.safe_dump(synthetic_profile("slow-decode", decode={"overhead_s": 0.5})))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    stack = LocalProcess(["--engine", "emulated", "--profile", str(profile), "--prefill", "1", "--decode", "1",
                          "--drain-grace-s", "1"], None)
    try:
        stack.wait_ready(120)
        [workdir] = tmp_path.glob("laps-local-*")
        body = {"model": "slow-decode", "prompt": "hi", "max_tokens": 200, "stream": True}  # ~100 s
        with httpx.stream("POST", f"{stack.url}/completions", json=body, timeout=60) as reply:
            lines = reply.iter_lines()
            assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")
            stack.proc.send_signal(signal.SIGINT)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest and "data: [DONE]" not in rest and "draining" in rest[-1]   # cut, and said so
        # A token each 0.5 s: the gateway's old fixed 30 s let ~60 more through before the cut.
        assert len(rest) < 30, f"{len(rest)} events after Ctrl-C"
        assert stack.proc.wait(30) == 0
        assert not workdir.exists() and "engine logs kept" not in "".join(stack.read_output())
    finally:
        stack.kill()


def test_ctrl_c_while_the_engines_load_is_a_clean_stop_that_leaves_no_temp_dir(tmp_path, monkeypatch):
    """The engines, told to stop while still importing, end by SIGTERM's default action, not
    with status 0: that read as a failure, and every interrupted start left a directory of
    empty logs behind ("engine logs kept in ...")."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    stack = LocalProcess(STACK, None)
    try:
        poll(lambda: _said(stack, "] starting "), timeout=60, message="the engines to be starting")
        stack.proc.send_signal(signal.SIGINT)   # long before they serve: their imports take seconds
        assert stack.proc.wait(30) == 0
        output = "".join(stack.read_output())
        assert "] stopped" in output and "engine logs kept" not in output and "Traceback" not in output
        assert not list(tmp_path.glob("laps-local-*"))
    finally:
        stack.kill()


def test_a_second_ctrl_c_while_the_engines_stop_kills_them_at_once(tmp_path):
    stack = LocalProcess(STACK, tmp_path)
    try:
        stack.wait_ready(120)
        stuck = _engine_pid(stack, tmp_path, "prefill-0")
        os.kill(stuck, signal.SIGSTOP)  # an engine that will not stop within the 15 s grace
        stack.proc.send_signal(signal.SIGINT)
        poll(lambda: _said(stack, "stopping engines"), timeout=30, message="the engines to be stopping")
        stack.proc.send_signal(signal.SIGINT)
        assert stack.proc.wait(10) == 130  # interrupted: the shell's code for Ctrl-C
        output = "".join(stack.read_output())
        assert "stopped now: engines killed" in output and "Traceback" not in output
        poll(lambda: not stack.leftovers(), timeout=10, message="every engine to be gone")
    finally:
        stack.kill()
