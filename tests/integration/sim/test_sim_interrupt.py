"""`laps sim` as a process: Ctrl-C between the systems it simulates."""
from __future__ import annotations

import signal
import subprocess
import sys

from laps_agent.lab.results import load_result


def test_ctrl_c_keeps_the_systems_simulated_and_says_so(tmp_path):
    """Ctrl-C after the first of two systems: exit 130, one line, the first system's results
    saved and complete (it used to be a KeyboardInterrupt traceback)."""
    # 30,000 requests: each system takes seconds, so the second is still running when the signal
    # arrives (sent as soon as the first's files are printed).
    proc = subprocess.Popen([sys.executable, "-m", "laps_agent.cli", "sim", "--workload", "lmsys-million",
                             "--max-requests", "30000", "--no-plots", "--systems", "laps,vanilla-pd",
                             "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # the first system's files are written: interrupt the second
            if line.startswith("files:"):
                proc.send_signal(signal.SIGINT)
                break
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip() == f"laps sim: interrupted after 1 of 2 system(s); theirs are saved in {tmp_path}"
    assert load_result(tmp_path / "laps").meta["system"] == "laps"
    assert not (tmp_path / "vanilla-pd" / "results.json").exists()
