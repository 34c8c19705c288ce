"""`laps sim`'s flags: values that cannot describe a run are refused with one line naming the
flag (they used to be a traceback, or silently replaced by the default), a threshold of 0
is a threshold of 0 (every prompt long), not the workload's (Ctrl-C, which needs a process of its
own: tests/integration/sim)."""
from __future__ import annotations

import json

import pytest

from laps_agent.lab.sim import main

RUN = ["--workload", "lmsys-steady", "--no-plots", "--max-requests", "20"]


@pytest.mark.parametrize("flag, value, message", [
    ("--prefill", "0", "argument --prefill: must be > 0, got 0"),
    ("--decode", "-1", "argument --decode: must be > 0, got -1"),
    ("--threshold", "-1", "argument --threshold: must be >= 0, got -1"),
    ("--rate-scale", "0", "argument --rate-scale: must be > 0, got 0"),
    ("--load", "0", "argument --load: must be > 0, got 0"),
    ("--max-requests", "0", "argument --max-requests: must be > 0, got 0"),
    ("--hop-ms", "-1", "argument --hop-ms: must be >= 0, got -1"),
    ("--warmup-s", "-2", "argument --warmup-s: must be >= 0, got -2"),
    # infinity used to be an OverflowError (rate) or a simulation that never ended (hop)
    ("--rate-scale", "inf", "argument --rate-scale: must be a finite number, got inf"),
    ("--hop-ms", "inf", "argument --hop-ms: must be a finite number, got inf"),
    # no system used to simulate nothing and exit 0
    ("--systems", ",", "argument --systems: expected comma-separated names, got ','"),
    # the allocation loop's flags, as `laps local` takes them
    ("--allocation-interval", "0", "argument --allocation-interval: must be > 0, got 0"),
    ("--allocation-ratio", "0.5", "argument --allocation-ratio: must be >= 1, got 0.5"),
    ("--min-per-group", "0", "argument --min-per-group: must be > 0, got 0"),
    # numpy's "expected non-negative integer" traceback, exit 1
    ("--seed", "-1", "argument --seed: must be >= 0, got -1"),
])
def test_impossible_values_are_refused_naming_the_flag(tmp_path, capsys, flag, value, message):
    args = [a for a in RUN if a not in ("--max-requests", "20")] if flag == "--max-requests" else RUN
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--out", str(tmp_path), flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"laps sim: error: {message}" in err and "Traceback" not in err
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("out, message", [
    ("file", "argument --out: {tmp}/file: exists and is not a directory"),
    ("file/run", "argument --out: {tmp}/file/run: {tmp}/file is not a directory"),
    # Writable by its permissions to root, yet no entry can be made there (root: "No such file or
    # directory"; anyone else: "not writable").
    ("/proc/laps-run", "argument --out: /proc/laps-run: cannot create it in /proc ("),
])
def test_an_output_directory_that_cannot_be_made_is_refused_before_simulating(tmp_path, capsys, out, message):
    """It used to be a FileExistsError traceback after the whole simulation."""
    (tmp_path / "file").write_text("not a directory\n")
    with pytest.raises(SystemExit) as exit_:
        main([*RUN, "--out", str(tmp_path / out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"laps sim: error: {message.format(tmp=tmp_path)}" in err and "Traceback" not in err
    assert "## laps" not in capsys.readouterr().out


def test_threshold_zero_is_honoured(tmp_path, capsys):
    assert main([*RUN, "--out", str(tmp_path), "--threshold", "0"]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["meta"]["threshold"] == 0
    assert "| short | 0 |" in capsys.readouterr().out  # every prompt is long at threshold 0


QUIET = """\
name: quiet
phases:
  - name: idle
    duration_s: 0.5
    arrival: {process: constant, rate: 1}
    prompt_tokens: {distribution: fixed, value: 8}
    output_tokens: {distribution: fixed, value: 2}
"""
NO_REQUEST = ("quiet.yaml: plans no request: phases[0] 'idle': 1 req/s for 0.5 s; lengthen duration_s or raise "
              "the rate (arrival.rate, --rate-scale, --load), or give requests: N")


@pytest.mark.parametrize("extra", [(), ("--load", "0.5")], ids=["as-given", "load"])
def test_a_workload_that_plans_no_request_is_refused_naming_its_phase(tmp_path, capsys, extra):
    """It used to simulate nothing, write an empty result and exit 0; with --load, a
    ZeroDivisionError traceback."""
    (tmp_path / "quiet.yaml").write_text(QUIET)
    out = tmp_path / "out"
    assert main(["--workload", str(tmp_path / "quiet.yaml"), "--no-plots", "--out", str(out), *extra]) == 2
    assert capsys.readouterr().err.strip() == f"laps sim: error: {NO_REQUEST}"
    assert not out.exists()


def test_a_phase_that_plans_no_request_among_others_is_refused_naming_it(tmp_path, capsys):
    """It ran as a silent pause, its row blank in every per-phase table."""
    busy = """\
  - name: busy
    requests: 3
    arrival: {process: constant, rate: 1}
    prompt_tokens: {distribution: fixed, value: 8}
    output_tokens: {distribution: fixed, value: 2}
"""
    (tmp_path / "gap.yaml").write_text(QUIET + busy)  # QUIET's phase first: 1 req/s for 0.5 s
    out = tmp_path / "out"
    assert main(["--workload", str(tmp_path / "gap.yaml"), "--no-plots", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        "laps sim: error: gap.yaml: phases[0] 'idle': 1 req/s for 0.5 s plans no request, unlike the other phases; "
        "lengthen duration_s or raise the rate (arrival.rate, --rate-scale, --load), or give requests: N")
    assert not out.exists()


def test_the_allocation_loop_takes_laps_locals_flags(tmp_path):
    """`laps sim --min-per-group 2` was `laps engine: error: unrecognized arguments` and the
    engine's whole usage text: the flags went to the engine models, not to the simulated loop."""
    assert main([*RUN, "--out", str(tmp_path), "--prefill", "4", "--min-per-group", "2",
                 "--allocation-interval", "2", "--allocation-ratio", "3"]) == 0
    got = json.loads((tmp_path / "results.json").read_text())["meta"]["allocation"]
    assert (got["rule"], got["interval_s"], got["ratio"], got["min_per_group"]) == ("laps", 2.0, 3.0, 2)


@pytest.mark.parametrize("extra, message", [
    (["--prefill", "3", "--min-per-group", "2"],
     "--min-per-group 2 needs at least 4 prefill pods (laps moves pods between two groups), got --prefill 3"),
    (["--systems", "vanilla-pd", "--allocation-ratio", "3"],
     "--allocation-ratio 3 tunes the allocation loop, and none of the systems (vanilla-pd) runs one: leave it "
     "out, or add a system that does (laps)"),
    (["--no-allocation", "--min-per-group", "2"],
     "--min-per-group 2 tunes the allocation loop, and none of the systems (laps) runs one: leave it out, or "
     "add a system that does (laps)"),
    (["--prefill", "1", "--allocation-ratio", "3"],   # one prefill pod: none to move, as in laps local
     "--allocation-ratio 3 tunes the allocation loop, and none of the systems (laps) runs one: leave it out, "
     "or add a system that does (laps)"),
    (["--systems", "vanilla-pd", "--allocation", "laps"],
     "--allocation laps tunes the allocation loop, and none of the systems (vanilla-pd) runs one: leave it "
     "out, or add a system that does (laps)"),
    (["--wait-windw-ms", "3"],
     "unrecognized arguments: --wait-windw-ms 3 (neither laps sim's flags nor laps engine's)"),
], ids=["min-per-group-too-big", "no-loop", "no-allocation", "one-prefill", "allocation-unused", "typo"])
def test_flags_no_simulated_engine_or_loop_takes_are_one_line(tmp_path, capsys, extra, message):
    """Unknown flags went to the engine models, which exited with `laps engine: error:` and
    their whole usage text; allocation flags no loop uses were silently ignored."""
    assert main([*RUN, "--out", str(tmp_path), *extra]) == 2
    assert capsys.readouterr().err.strip() == f"laps sim: error: {message}"
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("flag, value", [("--kv-pages", "-1"), ("--context-length", "0")])
def test_engine_flag_values_every_engine_refuses_are_refused_before_simulating(tmp_path, capsys, flag, value):
    """laps engine and laps local refuse these; sim used to run them: every request an HTTP 400
    (--kv-pages -1), or the flag silently ignored (--context-length 0), and exit 0."""
    assert main([*RUN, "--out", str(tmp_path), flag, value]) == 2
    assert capsys.readouterr().err.strip() == f"laps sim: error: engine flags: {flag} must be >= 1, got {value}"
    assert not (tmp_path / "results.json").exists()
