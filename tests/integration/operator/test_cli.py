"""`laps operator` as a user starts it: help works, and the operator image needs no torch."""
from __future__ import annotations

import subprocess
import sys


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_laps_operator_help_lists_the_options():
    result = subprocess.run([sys.executable, "-m", "laps_agent.cli", "operator", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for option in ("--namespace", "--all-namespaces", "--kubeconfig", "--metrics-port", "--liveness-port",
                   "--log-level"):
        assert option in result.stdout


def test_operator_modules_import_without_torch_or_fastapi():
    result = run_python(
        "import sys, laps_operator.main, laps_operator.cli\n"
        "heavy = sorted(m for m in ('torch', 'fastapi', 'uvicorn') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_unknown_option_is_a_usage_error():
    result = subprocess.run([sys.executable, "-m", "laps_agent.cli", "operator", "--bogus"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "unrecognized arguments: --bogus" in result.stderr
