"""Workload files: what a user writes, and the errors they get (naming the file and the field)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from laps_agent.lab.workload import WorkloadError, available_workloads, load_workload, plan_requests

GOOD = """\
name: mix
seed: 7
phases:
  - name: warm
    duration_s: 20
    arrival: {process: poisson, rate: 40}
    prompt_tokens: {distribution: lmsys}
    output_tokens: {distribution: fixed, value: 16}
  - name: burst
    requests: 500
    arrival: {process: bursty, rate: 40, burst_factor: 4, burst_s: 2, period_s: 10}
    prompt_tokens:
      distribution: mixture
      components:
        - {weight: 0.85, distribution: uniform, min: 16, max: 256}
        - {weight: 0.15, distribution: lognormal, median: 1500, sigma: 0.6, min: 257, max: 8000}
    output_tokens: {distribution: uniform, min: 8, max: 64}
"""


def write(tmp_path: Path, text: str, name: str = "workload.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    return str(info.value)


def test_the_documented_example_loads_with_defaults(tmp_path):
    spec = load_workload(write(tmp_path, GOOD))
    assert spec.name == "mix" and spec.seed == 7
    assert spec.api == "completions" and spec.threshold == 256
    assert [p.name for p in spec.phases] == ["warm", "burst"]
    assert spec.phases[1].arrival.mean_rate == pytest.approx(40 * (1 + 3 * 2 / 10))


@pytest.mark.parametrize(("change", "expected"), [
    (("distribution: lmsys", "distribution: zipf"),
     "workload.yaml: phases[0].prompt_tokens.distribution: unknown distribution 'zipf'"),
    (("{process: poisson, rate: 40}", "{process: poisson, rate: -3}"),
     "workload.yaml: phases[0].arrival.rate: must be > 0"),
    (("rate: 40, burst_factor", "rate: 0, burst_factor"),
     "workload.yaml: phases[1].arrival.rate: must be > 0"),
    (("{distribution: uniform, min: 8, max: 64}", "{distribution: uniform, min: 80, max: 64}"),
     "workload.yaml: phases[1].output_tokens.min: must be <= max (64), got 80"),
    (("    requests: 500", "    requests: 500\n    duration_s: 5"),
     "workload.yaml: phases[1]: give exactly one of duration_s or requests"),
    (("    duration_s: 20\n", ""),
     "workload.yaml: phases[0]: give exactly one of duration_s or requests"),
    (("{process: poisson, rate: 40}", "{process: poisson, rate: 40, burst: 2}"),
     "workload.yaml: phases[0].arrival.burst: unknown key"),
    (("{weight: 0.15,", "{weight: 0,"),
     "workload.yaml: phases[1].prompt_tokens.components[1].weight: must be > 0"),
    (("{weight: 0.15, ", "{"),
     "workload.yaml: phases[1].prompt_tokens.components[1].weight: required in a mixture"),
    (("burst_s: 2, period_s: 10", "burst_s: 20, period_s: 10"),
     "workload.yaml: phases[1].arrival.burst_s: must be <= period_s (10), got 20"),
    (("{process: poisson, rate: 40}", "{process: steady, rate: 40}"),
     "workload.yaml: phases[0].arrival.process: unknown process 'steady'"),
    (("name: burst", "name: warm"), "workload.yaml: phases[1].name: duplicate phase name 'warm'"),
    # `.inf` is YAML's infinity: it passed "> 0" and planning met it as an OverflowError
    (("{process: poisson, rate: 40}", "{process: poisson, rate: .inf}"),
     "workload.yaml: phases[0].arrival.rate: must be a finite number"),
    (("duration_s: 20", "duration_s: .inf"), "workload.yaml: phases[0].duration_s: must be a finite number"),
    (("median: 1500", "median: .nan"),
     "workload.yaml: phases[1].prompt_tokens.components[1].median: must be a finite number"),
])
def test_invalid_fields_are_named_with_the_file(tmp_path, change, expected):
    old, new = change
    assert old in GOOD
    message = error_of(write(tmp_path, GOOD.replace(old, new, 1)))
    assert expected in message, message


def test_every_error_of_a_file_is_reported(tmp_path):
    text = GOOD.replace("rate: 40}", "rate: -1}").replace("min: 8, max: 64", "min: 9, max: 2")
    lines = error_of(write(tmp_path, text, "mine.yaml")).splitlines()
    assert "mine.yaml: phases[0].arrival.rate: must be > 0" in lines
    assert "mine.yaml: phases[1].output_tokens.min: must be <= max (2), got 9" in lines


def test_yaml_syntax_errors_and_non_mappings_name_the_file(tmp_path):
    assert "broken.yaml: not valid YAML" in error_of(write(tmp_path, "name: [unclosed\n", "broken.yaml"))
    assert "list.yaml: a workload is a YAML mapping" in error_of(write(tmp_path, "- a\n- b\n", "list.yaml"))


def test_unknown_name_lists_the_built_in_workloads():
    with pytest.raises(WorkloadError) as info:
        load_workload("no-such-workload")
    assert "lmsys-steady" in str(info.value) and "mixed-shift" in str(info.value)


def test_built_in_workloads_load_by_name():
    assert {"lmsys-steady", "mixed-shift"} <= set(available_workloads())
    steady = load_workload("lmsys-steady")
    assert len(steady.phases) == 1
    assert steady.phases[0].prompt_tokens.distribution == "lmsys"
    assert steady.phases[0].arrival.process == "poisson"


def test_mixed_shift_moves_the_short_share_from_85_to_15_and_back():
    spec = load_workload("mixed-shift")
    plan = plan_requests(spec, rate_scale=200)  # many requests per phase: shares close to the mix
    shares = []
    for window in plan.phases:
        prompts = plan.prompt_tokens[plan.phase == window.index]
        shares.append(float((prompts <= spec.threshold).mean()))
    assert shares == pytest.approx([0.85, 0.15, 0.85], abs=0.02)


def test_spec_round_trips_through_its_dict(tmp_path):
    from laps_agent.lab.workload import parse_workload

    spec = load_workload(write(tmp_path, GOOD))
    again = parse_workload(spec.to_dict())
    assert again.to_dict() == spec.to_dict()
