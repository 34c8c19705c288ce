"""The simulator agrees with the emulated cluster it models: one workload through `laps local
--engine emulated` (8 prefill pods, measured with `laps bench run`) and through `laps sim` with
the same profile, seed and system: TTFT p50 and p90 of each class within 15%.

What differs between the two is what the simulator does not model (HTTP hops and event-loop
wake-ups, about a millisecond each on loopback); the load is kept moderate so that these
milliseconds are not multiplied by queueing on this 2-core machine."""
from __future__ import annotations

import subprocess
import sys

import pytest

from laps_agent.lab.results import load_result, summarize

WORKLOAD = """\
name: agreement
seed: 21
api: completions
threshold: 256
phases:
  - name: steady
    requests: 700
    arrival: {process: poisson, rate: 45}
    prompt_tokens: {distribution: lmsys}
    output_tokens: {distribution: fixed, value: 4}
"""
PROFILE = "gpu-h200-qwen2.5-32b"
CLUSTER = ("--prefill", "8", "--decode", "2")


def _cli(*args: str, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-m", "laps_agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_emulated_cluster_and_simulator_agree(laps_local, tmp_path):
    workload = tmp_path / "agreement.yaml"
    workload.write_text(WORKLOAD)
    # One membership in both (no allocation loop: its moves depend on when pressure is sampled).
    stack = laps_local("--engine", "emulated", "--profile", PROFILE, *CLUSTER, "--no-allocation", timeout=180)
    _cli("bench", "run", stack.url, "--workload", str(workload), "--out", str(tmp_path / "real"),
         "--no-progress")
    _cli("sim", "--workload", str(workload), "--profile", PROFILE, *CLUSTER, "--systems", "laps",
         "--allocation", "none", "--out", str(tmp_path / "sim"), "--no-plots")

    real = summarize(load_result(tmp_path / "real" / "results.json"))
    sim = summarize(load_result(tmp_path / "sim" / "results.json"))
    for cls in ("short", "long"):
        r, s = real.classes[cls], sim.classes[cls]
        assert r.ok == s.ok == r.sent  # every request answered in both
        for name in ("ttft_p50", "ttft_p90"):
            measured, simulated = getattr(r, name), getattr(s, name)
            assert simulated == pytest.approx(measured, rel=0.15), (cls, name, measured, simulated)
