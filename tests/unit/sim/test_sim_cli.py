"""`laps sim`'s flags: values that cannot describe a run are refused with one line naming the
flag (they used to be a traceback, or silently replaced by the default), and a threshold of 0
is a threshold of 0 (every prompt long), not the workload's."""
from __future__ import annotations

import json

import pytest

from laps_agent.sim import main

RUN = ["--workload", "lmsys-steady", "--no-plots", "--max-requests", "20"]


@pytest.mark.parametrize("flag, value, message", [
    ("--prefill", "0", "--prefill must be >= 1, got 0"),
    ("--decode", "-1", "--decode must be >= 1, got -1"),
    ("--threshold", "-1", "--threshold must be >= 0, got -1"),
    ("--rate-scale", "0", "--rate-scale must be > 0, got 0.0"),
    ("--load", "0", "--load must be > 0, got 0.0"),
    ("--max-requests", "0", "--max-requests must be >= 1, got 0"),
    ("--hop-ms", "-1", "--hop-ms must be >= 0, got -1.0"),
    ("--warmup-s", "-2", "--warmup-s must be >= 0, got -2.0"),
])
def test_impossible_values_are_refused_naming_the_flag(tmp_path, capsys, flag, value, message):
    args = [a for a in RUN if a not in ("--max-requests", "20")] if flag == "--max-requests" else RUN
    assert main([*args, "--out", str(tmp_path), flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("laps sim: error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "results.json").exists()


def test_threshold_zero_is_honoured(tmp_path, capsys):
    assert main([*RUN, "--out", str(tmp_path), "--threshold", "0"]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["meta"]["threshold"] == 0
    assert "| short | 0 |" in capsys.readouterr().out  # every prompt is long at threshold 0
