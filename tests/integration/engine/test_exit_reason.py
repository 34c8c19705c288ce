"""Why a laps container could not start, where Kubernetes shows it: its termination message
(`kubectl describe pod`'s "Message", and the LAPSCluster's Ready condition, which reads it). A
wrong model path is the commonest day-1 crash loop; without this the pod showed a bare
"Error, exit code 2" and the reason was only in its log.

The kubelet creates the file before the process starts (terminationMessagePath); here the test
does, and points the process at it as a pod with another path would (LAPS_TERMINATION_LOG)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from laps_agent import cli


def _laps(*args: str, log_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAPS_TERMINATION_LOG": str(log_path)}
    return subprocess.run([sys.executable, "-m", "laps_agent.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture
def termination_log(tmp_path):
    path = tmp_path / "termination-log"
    path.write_text("")   # as the kubelet makes it
    return path


def test_an_engine_without_its_model_says_why_in_its_termination_message(termination_log, tmp_path):
    missing = tmp_path / "models" / "m.gguf"
    result = _laps("engine", "--model", str(missing), "--port", "0", log_path=termination_log)
    assert result.returncode == 2
    said = termination_log.read_text()
    assert said == f"cannot start: {missing}: no such file or directory"
    assert f"laps engine: error: {missing}: no such file or directory" in result.stderr


def test_a_gateway_whose_tokenizer_path_is_wrong_says_so_in_one_line_and_in_its_termination_message(
        termination_log, tmp_path):
    missing = tmp_path / "models" / "m.gguf"   # the operator passes the model path as --tokenizer
    result = _laps("gateway", "--tokenizer", str(missing), "--port", "0", "--prefill-short", "http://127.0.0.1:9",
                   "--prefill-long", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9", log_path=termination_log)
    assert result.returncode == 1 and "Traceback" not in result.stderr   # it was a traceback
    line = f"cannot read a tokenizer: {missing}: no such file or directory"   # the path once: it may be long
    assert result.stderr.strip().splitlines()[-1] == f"laps gateway: error: {line}"
    assert termination_log.read_text() == f"cannot start: {line}"


def test_a_mistyped_engine_flag_says_which_in_its_termination_message(termination_log):
    """engine.extraArgs reach `laps engine` as written: a typo is refused by its flag parser."""
    result = _laps("engine", "--wait-windw-ms", "3", log_path=termination_log)
    assert result.returncode == 2 and "unrecognized arguments: --wait-windw-ms 3" in result.stderr
    assert termination_log.read_text() == "cannot start: unrecognized arguments: --wait-windw-ms 3"


def test_outside_kubernetes_no_file_is_made(tmp_path):
    nowhere = tmp_path / "termination-log"   # not made: as on a laptop, where /dev has none
    result = _laps("engine", "--model", str(tmp_path / "m.gguf"), "--port", "0", log_path=nowhere)
    assert result.returncode == 2 and not nowhere.exists()


def test_a_failure_nobody_foresaw_names_its_exception_and_keeps_its_traceback(termination_log, monkeypatch):
    """A command that raises (on a GPU: a CUDA error while capturing graphs, say)."""
    monkeypatch.setenv("LAPS_TERMINATION_LOG", str(termination_log))
    monkeypatch.setitem(cli.SUBCOMMANDS, "crash", ("tests.support.crashing_command", "raises"))
    with pytest.raises(RuntimeError, match="CUDA error: out of memory"):
        cli.main(["crash"])
    assert termination_log.read_text() == "RuntimeError: CUDA error: out of memory"
