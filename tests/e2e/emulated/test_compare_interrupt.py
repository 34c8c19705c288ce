"""Ctrl-C in the middle of `laps bench compare` (emulated engines at zero cost): the comparison
ends with what it measured, as `laps bench run` does. The system being measured keeps its
partial run (results.json marked interrupted, results.md saying so), compare.md is written for
the systems measured so far, the exit code is 130, no traceback, and no `laps local` process
is left behind. It used to end in a KeyboardInterrupt traceback with that system's run lost."""
from __future__ import annotations

import json
import signal
import sys

from laps_agent.local.process import alive, descendants
from tests.support.fixtures_gateway import ChildProcess
from tests.support.waiting import poll

WORKLOAD = """\
name: long-enough
phases:
  - name: steady
    duration_s: 120
    arrival: {process: poisson, rate: 5}
    prompt_tokens: {distribution: fixed, value: 16}
    output_tokens: {distribution: fixed, value: 4}
"""


def test_ctrl_c_mid_run_keeps_what_was_measured(tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "cmp"
    child = ChildProcess([sys.executable, "-m", "laps_agent.cli", "bench", "compare", "--workload", str(workload),
                          "--systems", "vanilla-pd,laps", "--prefill", "2", "--decode", "1",
                          "--profile", "instant", "--warmup-s", "0", "--out", str(out)])
    try:
        child.read_line_starting("[compare] vanilla-pd: measuring", timeout=180)
        child.read_line_starting("[laps bench]", timeout=60)  # the first progress line: requests answered
        stack = descendants(child.proc.pid)
        assert stack  # laps local and its engines
        child.proc.send_signal(signal.SIGINT)
        rest = child.proc.stdout.read()
        assert child.proc.wait(60) == 130, rest
    finally:
        child.kill()
    assert "Traceback" not in rest and "[compare] interrupted: the systems measured so far are saved" in rest
    result = json.loads((out / "vanilla-pd" / "results.json").read_text())
    meta = result["meta"]
    assert meta["interrupted"] and 0 < meta["sent_requests"] < meta["planned_requests"]
    assert 200 in result["requests"]["status"]
    assert "**Interrupted**" in (out / "vanilla-pd" / "results.md").read_text()
    compare = (out / "compare.md").read_text()
    assert compare.startswith("**Interrupted** after 1 system(s)") and "| vanilla-pd |" in compare
    assert not (out / "laps").exists()  # the next system never started
    poll(lambda: not any(alive(pid) for pid in stack), timeout=30, message="laps local to be gone")
