"""A workload whose problem is only found when it is planned (a JSONL prompt file with a bad
line, a phase of trillions of requests) is refused by `laps bench run`, `laps bench compare` and
`laps sim` as a bad workload file is: one error line naming the file and line or phase, exit
code 2, nothing sent and no system started. They used to end in a Python traceback (a
MemoryError for the huge phase, even with --max-requests). And `laps bench compare` refuses flag
values that cannot describe a run before starting anything, as `laps sim` does."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

PHASE = """\
name: {name}
phases:
  - name: steady
    {size}
    arrival: {{process: poisson, rate: {rate}}}
    prompt_tokens: {prompt}
    output_tokens: {{distribution: fixed, value: 2}}
"""


def _workload(tmp_path, name: str, *, rate: float = 5, size: str = "requests: 4",
              prompt: str = "{distribution: fixed, value: 8}") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(PHASE.format(name=name, rate=rate, size=size, prompt=prompt))
    return str(path)


def _jsonl_workload(tmp_path, lines: list[str]) -> str:
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    return _workload(tmp_path, "lines", prompt="{distribution: jsonl, path: prompts.jsonl}")


def _laps(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laps_agent.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


BAD_FILES = [
    (['{"prompt": "one"}', '{"prompt": "two", ', '{"prompt": "three"}'], "prompts.jsonl:2: not valid JSON"),
    (['{"prompt": "one"}', '{"prompt": ""}'], "prompts.jsonl:2: prompt: must be a non-empty string"),
]


@pytest.fixture
def engine(engine_launcher, tiny_engine_model):
    """One emulated engine at zero cost (OpenAI endpoints, /metrics): the target of `bench run`."""
    return engine_launcher(tiny_engine_model, "mixed", ("--backend", "emulated", "--profile", "instant"))


def served(engine) -> int:
    """Requests the engine has prefilled, from its own /metrics."""
    page = httpx.get(engine.url + "/metrics", timeout=10).text
    return int(sum(s.value for f in text_string_to_metric_families(page) for s in f.samples
                   if s.name == "laps_engine_class_total"))


@pytest.mark.parametrize("lines, message", BAD_FILES)
def test_bench_run_refuses_a_bad_jsonl_line_and_sends_nothing(tmp_path, engine, lines, message):
    done = _laps("bench", "run", engine.url, "--workload", _jsonl_workload(tmp_path, lines), "--tokenizer", "none",
                 "--out", str(tmp_path / "out"), "--no-progress")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"laps bench run: error: {message}" in done.stderr and "Traceback" not in done.stderr
    assert served(engine) == 0 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("lines, message", BAD_FILES)
def test_sim_and_compare_refuse_a_bad_jsonl_line(tmp_path, lines, message):
    workload = _jsonl_workload(tmp_path, lines)
    sim = _laps("sim", "--workload", workload, "--no-plots", "--out", str(tmp_path / "sim"))
    assert sim.returncode == 2 and f"laps sim: error: {message}" in sim.stderr and "Traceback" not in sim.stderr
    compare = _laps("bench", "compare", "--workload", workload, "--out", str(tmp_path / "cmp"))
    assert compare.returncode == 2, compare.stdout + compare.stderr
    assert f"laps bench compare: error: {message}" in compare.stderr and "Traceback" not in compare.stderr
    assert "starting laps local" not in compare.stdout and not (tmp_path / "cmp").exists()


def test_a_phase_too_large_to_plan_is_refused_naming_it(tmp_path, engine):
    workload = _workload(tmp_path, "flood", rate=1e11, size="duration_s: 60")
    expected = "flood.yaml: phases[0]: plans about 6e+12 requests"
    for args, prefix in ((["bench", "run", engine.url, "--tokenizer", "none", "--no-progress"], "laps bench run"),
                         (["sim", "--no-plots"], "laps sim"), (["bench", "compare"], "laps bench compare")):
        done = _laps(*args, "--workload", workload, "--out", str(tmp_path / "out"))
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"{prefix}: error: {expected}" in done.stderr and "--max-requests" in done.stderr
        assert "Traceback" not in done.stderr
    assert served(engine) == 0 and not (tmp_path / "out").exists()


def test_max_requests_runs_the_first_requests_of_a_huge_phase(tmp_path, engine):
    workload = _workload(tmp_path, "flood", rate=1e11, size="duration_s: 60")
    done = _laps("bench", "run", engine.url, "--workload", workload, "--tokenizer", "none", "--max-requests", "3",
                 "--out", str(tmp_path / "out"), "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["meta"]["planned_requests"] == 3 and result["requests"]["status"] == [200, 200, 200]
    assert served(engine) == 3


@pytest.mark.parametrize("flag, value", [("--rate-scale", "0"), ("--load", "-0.5"), ("--prefill", "0"),
                                         ("--max-requests", "0"), ("--slo", "short=-1")])
def test_compare_refuses_values_that_cannot_describe_a_run(tmp_path, flag, value):
    """`--rate-scale 0` used to run at rate x1 (0 read as "not given"), the others failed later."""
    done = _laps("bench", "compare", "--workload", "lmsys-steady", flag, value, "--out", str(tmp_path / "cmp"))
    assert done.returncode == 2 and f"argument {flag}:" in done.stderr and "Traceback" not in done.stderr
    assert "starting laps local" not in done.stdout and not (tmp_path / "cmp").exists()
