"""`laps sim --matrix`: the matrix file (errors name the field), the cells it defines, and the
report of a run of the small built-in matrix (every cell, every system, the baseline's ratios
1.0, a refused request an infinite TTFT and an SLO miss). Nothing here asserts who wins."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from laps_agent.lab.matrix.report import agreement, agreement_markdown, cell_metrics, summarize, verdict, with_ratios
from laps_agent.lab.matrix.spec import MatrixError, cell_setup, load_matrix, parse_matrix, shortened, whole_periods
from laps_agent.lab.results.records import RequestTable, RunResult
from laps_agent.lab.sim import main
from laps_agent.lab.sim.matrix import run_matrix

ARRIVALS = {"steady": {"process": "poisson", "rate": 1},
            "ramp": [{"process": "poisson", "rate": 0.5}, {"process": "poisson", "rate": 1.5}]}
LENGTHS = {"uniform": {"prompt_tokens": {"distribution": "uniform", "min": 16, "max": 2000},
                       "output_tokens": {"distribution": "fixed", "value": 8}}}
GOOD = {"systems": ["vanilla-pd", "laps"], "shapes": ["4P+4D", "8P+2D"], "loads": [0.5, 0.9],
        "arrivals": ARRIVALS, "lengths": LENGTHS, "workloads": ["lmsys-steady"], "max_requests": 100}


def test_cells_are_workloads_x_profiles_x_shapes_x_loads():
    m = parse_matrix(GOOD, "m.yaml")
    cells = m.cells()
    assert len(cells) == 3 * 1 * 2 * 2
    assert [c.workload for c in cells[::4]] == ["lmsys-steady", "steady/uniform", "ramp/uniform"]
    assert {(c.shape.prefill, c.shape.decode) for c in cells} == {(4, 4), (8, 2)}
    setup = cell_setup(m, cells[-1])   # ramp/uniform: one phase per arrival process
    assert (setup.prefill, setup.decode, setup.load) == (8, 2, 0.9)
    assert [p.arrival.rate for p in setup.spec.phases] == [0.5, 1.5]
    assert sum(p.duration_s for p in setup.spec.phases) == pytest.approx(120)
    assert [p.duration_s for p in shortened(setup.spec, 0.1).phases] == pytest.approx([6, 6])


def test_a_shortened_bursty_cell_keeps_one_whole_period():
    """A cell shorter than one burst period would measure its first burst (an overload at the
    burst's rate), not bursts at the cell's load: the bursty phase keeps one period at least."""
    bursty = {"bursty": {"process": "bursty", "rate": 1, "burst_factor": 4, "burst_s": 10, "period_s": 40}}
    m = parse_matrix({**GOOD, "arrivals": {**ARRIVALS, **bursty}}, "m.yaml")
    spec = cell_setup(m, next(c for c in m.cells() if c.workload == "bursty/uniform")).spec
    assert [p.duration_s for p in shortened(spec, 0.1).phases] == pytest.approx([40])
    assert [p.duration_s for p in shortened(spec, 0.5).phases] == pytest.approx([60])
    assert whole_periods(spec, 0.1) and not whole_periods(spec, 0.5)
    steady = cell_setup(m, m.cells()[4]).spec   # steady/uniform
    assert not whole_periods(steady, 0.1)


@pytest.mark.parametrize("change, message", [
    ({"shapes": ["8P+2D", "8+2"]}, "m.yaml: shapes[1]: expected <P>P+<D>D"),
    ({"loads": [0.5, 0]}, "m.yaml: loads[1]: must be > 0, got 0"),
    ({"slo": {"short": 0.5, "medium": 1}}, "m.yaml: slo.medium: unknown class"),
    ({"max_requests": 0}, "m.yaml: max_requests: must be >= 1"),
    ({"systems": []}, "m.yaml: systems: must not be empty"),
    ({"systems": ["laps", "laps"]}, "m.yaml: systems[1]: 'laps' is listed twice"),
    ({"shape": ["8P+2D"]}, "m.yaml: shape: unknown key"),
    ({"lengths": {}}, "m.yaml: lengths: required with arrivals"),
    ({"arrivals": {}, "lengths": {}, "workloads": []}, "m.yaml: workloads: give workloads, or arrivals"),
    ({"workloads": ["no-such-workload"]}, "m.yaml: workloads[0]: unknown workload 'no-such-workload'"),
    ({"arrivals": {"steady": {"process": "poisson", "rate": -1}}}, "m.yaml: arrivals.steady"),
])
def test_a_bad_matrix_is_refused_naming_the_field(change, message):
    with pytest.raises(MatrixError) as exc:
        parse_matrix({**GOOD, **change}, "m.yaml")
    assert message in str(exc.value)


def test_a_matrix_that_is_not_a_file_or_a_builtin_is_refused():
    with pytest.raises(MatrixError, match="unknown matrix 'nope'.*family, small"):
        load_matrix("nope")


def test_the_builtin_family_is_wide():
    m = load_matrix("family")
    s = m.spec
    assert s.systems[0] == "vanilla-pd" and {"laps", "laps-pooled", "sglang-cache-aware"} <= set(s.systems)
    assert set(s.shapes) == {"4P+4D", "8P+2D", "16P+4D"} and min(s.loads) == 0.3 and max(s.loads) == 0.9
    assert {"steady", "bursty", "ramp"} <= set(s.arrivals)
    assert {"lmsys", "uniform", "shifting", "long-heavy", "multi-turn"} <= set(s.lengths)
    assert len(m.cells()) >= 180


def _result(status, ttft, cls, duration=10.0) -> RunResult:
    n = len(status)
    table = RequestTable.from_columns(
        index=np.arange(n), phase=np.array(["p"] * n, dtype=object), cls=np.array(cls, dtype=object),
        prompt_tokens=np.full(n, 100), output_tokens=np.full(n, 8), sent_s=np.zeros(n),
        status=np.array(status), ttft_s=np.array(ttft, dtype=float), e2e_s=np.array(ttft, dtype=float))
    return RunResult({"duration_s": duration}, table)


def test_a_refused_request_is_an_infinite_ttft_and_a_miss():
    nan = float("nan")
    m = cell_metrics(_result([200, 429, 200, 200], [0.1, nan, 0.2, 5.0], ["short", "short", "long", "long"]),
                     {"short": 0.5, "long": 3})
    assert m["short"]["sent"] == 2 and m["short"]["failed"] == 1
    assert m["short"]["attainment"] == 0.5 and math.isinf(m["short"]["ttft_p90"])
    assert m["long"]["attainment"] == 0.5 and m["long"]["ttft_p50"] == 0.2
    assert m["all"]["goodput"] == pytest.approx(2 / 10)


def test_lost_and_won_by_one_point_in_a_class():
    assert verdict({"short": -1.5, "long": 20}) == "lost"
    assert verdict({"short": 1.5, "long": -0.5}) == "won"
    assert verdict({"short": 0.9, "long": None}) == "tied"
    base = cell_metrics(_result([200, 200], [0.1, 0.1], ["short", "long"]), {"short": 0.5, "long": 3})
    shed = cell_metrics(_result([200, 429], [0.1, float("nan")], ["short", "long"]), {"short": 0.5, "long": 3})
    cell = with_ratios({"label": "c", "systems": {"a": base, "b": shed}}, ["a", "b"])
    assert cell["systems"]["b"]["delta_points"] == {"short": 0.0, "long": -100.0}
    assert cell["systems"]["b"]["ratio"]["long"]["ttft_p90"] == math.inf
    assert summarize([cell], ["a", "b"])["b"]["lost"] == 1


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix")
    return out, run_matrix(load_matrix("small"), out, log=lambda line: None).report


def test_the_small_matrix_reports_every_cell_and_system_against_the_baseline(small):
    out, report = small
    systems = report["systems"]
    assert systems[0] == "vanilla-pd" and {"laps", "laps-pooled", "sglang-cache-aware"} <= set(systems)
    assert len(report["cells"]) == len(load_matrix("small").cells()) >= 12
    assert len({c["label"] for c in report["cells"]}) == len(report["cells"])
    for cell in report["cells"]:
        assert set(cell["systems"]) == set(systems)
        # the budget, but a bursty cell's one whole period (test_a_shortened_bursty_cell_keeps_one_whole_period)
        bursty = cell["workload"].startswith("bursty")   # its period: 20 s
        assert 0 < cell["requests"] <= (max(300, 1.3 * cell["rate"] * 20) if bursty else 300)
        assert cell["rate"] == pytest.approx(cell["load"] * cell["capacity"])
        for name in systems:
            m = cell["systems"][name]
            for cls in ("short", "long", "all"):
                assert {"ttft_p50", "ttft_p90", "attainment", "goodput"} <= set(m[cls])
                if m[cls]["sent"]:  # a refused request is a miss
                    assert m[cls]["attainment"] * m[cls]["sent"] <= m[cls]["sent"] - m[cls]["failed"] + 1e-9
        base = cell["systems"][systems[0]]
        assert all(v == 1.0 for row in base["ratio"].values() for v in row.values() if v is not None)
        assert all(d == 0 for d in base["delta_points"].values() if d is not None)
    summary = report["summary"]
    assert set(summary) == set(systems[1:])
    for s in summary.values():
        assert s["lost"] + s["won"] + s["tied"] == len(report["cells"]) and s["worst"]["cell"]
    saved = json.loads((out / "matrix.json").read_text())
    assert len(saved["cells"]) == len(report["cells"])
    text = (out / "matrix.md").read_text()
    assert "cells lost" in text and all(c["label"] in text for c in report["cells"])
    assert (out / "matrix-heatmap.png").stat().st_size > 1000


def test_a_matrix_run_is_deterministic(tmp_path, small):
    again = run_matrix(load_matrix("small"), tmp_path, plots=False, log=lambda line: None).report
    assert json.dumps(again["cells"], default=str) == json.dumps(small[1]["cells"], default=str)


def test_laps_sim_matrix_from_the_command_line(tmp_path, capsys):
    assert main(["--matrix", "small", "--systems", "vanilla-pd,laps-pooled", "--max-requests", "40",
                 "--no-plots", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "[16/16]" in printed and "| laps-pooled |" in printed
    report = json.loads((tmp_path / "matrix.json").read_text())
    assert report["systems"] == ["vanilla-pd", "laps-pooled"] and report["max_requests"] == 40
    assert not (tmp_path / "matrix-heatmap.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--prefill", "4"], "--prefill cannot go with --matrix"),
    (["--load", "0.5"], "--load cannot go with --matrix"),
    (["--systems", "vanilla-pd,nope"], "unknown system 'nope'"),
])
def test_what_a_matrix_sets_per_cell_is_refused_as_a_flag(tmp_path, capsys, args, message):
    assert main(["--matrix", "small", "--no-plots", "--out", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "matrix.json").exists()


def test_ctrl_c_saves_the_cells_done(tmp_path, capsys, monkeypatch):
    import laps_agent.lab.sim.matrix as runner

    calls = []
    real = runner.cell_metrics

    def interrupted(result, slo):
        calls.append(1)
        if len(calls) > 2 * 2:  # two cells of two systems, then Ctrl-C
            raise KeyboardInterrupt
        return real(result, slo)

    monkeypatch.setattr(runner, "cell_metrics", interrupted)
    assert main(["--matrix", "small", "--systems", "vanilla-pd,laps", "--max-requests", "30",
                 "--out", str(tmp_path)]) == 130
    assert f"interrupted after 2 cell(s); theirs are saved in {tmp_path}" in capsys.readouterr().err
    report = json.loads((tmp_path / "matrix.json").read_text())
    assert len(report["cells"]) == 2 and report["summary"]["laps"]["cells"] == 2


def _metrics(p90_short: float, p90_long: float) -> dict:
    row = {"sent": 10, "failed": 0, "ttft_p50": 0.05, "attainment": 1.0, "goodput": 1.0}
    return {"short": {**row, "ttft_p90": p90_short}, "long": {**row, "ttft_p90": p90_long},
            "all": {**row, "ttft_p90": max(p90_short, p90_long)}}


def test_agreement_compares_each_systems_p90_ratios_measured_and_simulated():
    """`laps bench compare --matrix`: measured over HTTP, laps is 0.5x vanilla-pd's short p90 and
    1.2x its long; simulated, 0.5x and 1.0x: the short ratio agrees, the long one is 20% off."""
    systems = ["vanilla-pd", "laps"]
    cell = with_ratios({"label": "c", "systems": {"vanilla-pd": _metrics(0.2, 1.0), "laps": _metrics(0.1, 1.2)}},
                       systems)
    cell["sim"] = with_ratios({"systems": {"vanilla-pd": _metrics(0.3, 1.1), "laps": _metrics(0.15, 1.1)}},
                              systems)["systems"]
    agreed = agreement({"systems": systems, "cells": [cell, {"label": "sim-less", "systems": {}}]})
    rows = {(r["system"], r["class"]): r for r in agreed["rows"]}
    assert len(rows) == 4                                       # the cell without `sim` is left out
    assert rows["vanilla-pd", "short"]["deviation"] is None     # the baseline's ratio is 1 by definition
    assert rows["laps", "short"]["deviation"] == pytest.approx(0.0)
    assert rows["laps", "long"]["deviation"] == pytest.approx(0.2)
    assert (agreed["judged"], agreed["met"]) == (2, 1)
    assert agreed["worst"] is rows["laps", "long"]
    assert "1/2 p90 ratios agree within 15%" in agreement_markdown(agreed)


def test_agreement_compares_the_p90s_themselves_where_the_baseline_lost_its_p90():
    """A baseline that lost more than 10% of a class has an infinite p90: every system's ratio is
    0 both ways, which would agree whatever the figures; the system's own p90s are compared."""
    systems = ["vanilla-pd", "laps"]
    cell = with_ratios({"label": "c", "systems": {"vanilla-pd": _metrics(math.inf, 1.0), "laps": _metrics(0.5, 1.0)}},
                       systems)
    cell["sim"] = with_ratios({"systems": {"vanilla-pd": _metrics(math.inf, 1.0), "laps": _metrics(0.4, 1.0)}},
                              systems)["systems"]
    rows = {(r["system"], r["class"]): r for r in agreement({"systems": systems, "cells": [cell]})["rows"]}
    assert rows["laps", "short"]["basis"] == "p90"
    assert rows["laps", "short"]["deviation"] == pytest.approx(0.25)
    assert rows["laps", "long"]["basis"] == "ratio"
