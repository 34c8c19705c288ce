"""Run results: summaries of hand-made records, result files, markdown and plots."""
from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
from PIL import Image

from laps_agent.lab.results import (
    RequestRecord,
    RequestTable,
    RunResult,
    TimelineSample,
    compare_markdown,
    load_result,
    markdown,
    save,
    summarize,
)
from laps_agent.lab.results.plots import DPI, FIGSIZE

PHASES = [{"name": "one", "start_s": 0.0, "end_s": 5.0}, {"name": "two", "start_s": 5.0, "end_s": 10.0}]


def ok(i, cls, ttft, *, phase="one", e2e=None, tokens=4, itl=0.01):
    return RequestRecord(index=i, phase=phase, cls=cls, prompt_tokens=100 if cls == "short" else 1000,
                         output_tokens=tokens, sent_s=float(i), status=200, ttft_s=ttft,
                         e2e_s=e2e if e2e is not None else ttft + 0.1, tokens=tokens, itl_mean_s=itl,
                         itl_p90_s=itl, itl_max_s=itl, server_prompt_tokens=100)


def failed(i, cls, status, phase="two", error="boom"):
    return RequestRecord(index=i, phase=phase, cls=cls, prompt_tokens=100 if cls == "short" else 1000,
                         output_tokens=4, sent_s=float(i), status=status, error=error, e2e_s=0.5)


@pytest.fixture
def result() -> RunResult:
    records = [ok(i, "short", ttft) for i, ttft in enumerate([0.1, 0.2, 0.3, 0.4, 0.5])]
    records += [ok(5, "long", 1.0, phase="two", tokens=10, itl=0.02), ok(6, "long", 3.0, phase="two", itl=0.04),
                failed(7, "short", 503), failed(8, "long", 0, error="connection refused"),
                failed(9, "short", 200, error="stream ended without [DONE]")]
    timeline = [TimelineSample(float(t), {"short": 1, "long": 1 + (t > 4)}, {"short": 10 * t, "long": 500},
                               {"short": t, "long": 1}) for t in range(10)]
    meta = {"label": "hand", "duration_s": 10.0, "phases": PHASES, "threshold": 256,
            "workload": {"name": "w", "spec": {"name": "w"}}}
    return RunResult(meta, records, timeline)


def test_counts_percentiles_and_errors_by_class(result):
    s = summarize(result)
    short, long_, all_ = s.classes["short"], s.classes["long"], s.classes["all"]
    assert (short.sent, short.ok, short.failed) == (7, 5, 2)
    assert (long_.sent, long_.ok, long_.failed) == (3, 2, 1)
    assert (all_.sent, all_.ok, all_.failed) == (10, 7, 3)
    assert short.errors == {"200": 1, "503": 1} and long_.errors == {"0": 1}
    # numpy linear interpolation over the ok requests' TTFTs 0.1..0.5
    assert short.ttft_p50 == pytest.approx(0.3) and short.ttft_p90 == pytest.approx(0.46)
    assert short.ttft_p99 == pytest.approx(0.496)
    assert long_.ttft_p50 == pytest.approx(2.0) and long_.e2e_p90 == pytest.approx(2.9)
    assert long_.itl_p50 == pytest.approx(0.03) and short.itl_p90 == pytest.approx(0.01)
    assert all_.req_per_s == pytest.approx(0.7) and all_.tokens_per_s == pytest.approx((5 * 4 + 10 + 4) / 10)


def test_slo_attainment_counts_failures_as_misses(result):
    s = summarize(result, slo={"short": 0.25, "long": 2.0})
    assert s.classes["short"].slo_attainment == pytest.approx(2 / 7)   # 0.1, 0.2 of 7 sent
    assert s.classes["long"].slo_attainment == pytest.approx(1 / 3)    # 1.0 of 3 sent
    assert s.classes["all"].slo_attainment == pytest.approx(3 / 10)    # each against its own class
    assert s.classes["short"].slo_s == 0.25
    only_short = summarize(result, slo={"short": 0.25})
    assert only_short.classes["long"].slo_attainment is None and only_short.classes["all"].slo_attainment is None
    everyone = summarize(result, slo={"all": 1.0})
    assert everyone.classes["all"].slo_attainment == pytest.approx(6 / 10)


def test_summary_by_phase_uses_the_phase_windows(result):
    s = summarize(result, by_phase=True)
    assert list(s.phases) == ["one", "two"]
    assert s.phases["one"]["short"].sent == 5 and s.phases["two"]["all"].sent == 5
    assert s.phases["two"]["long"].req_per_s == pytest.approx(2 / 5)


def test_save_and_load_round_trip(result, tmp_path):
    paths = save(result, tmp_path / "out", slo={"short": 0.25})
    assert {p.name for p in paths.values()} == {"results.json", "results.md", "ttft_cdf.png",
                                               "ttft_timeline.png", "groups_timeline.png"}
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["requests"]["ttft_s"][:2] == [0.1, 0.2] and doc["requests"]["ttft_s"][7] is None  # columns
    again = load_result(tmp_path / "out")
    # times are stored to the microsecond
    assert len(again.records) == len(result.records)
    for loaded, original in zip(again.records, result.records):
        assert asdict(loaded) == pytest.approx(asdict(original), abs=1e-6)
    assert again.timeline == result.timeline and again.meta == result.meta
    assert "| short | 7 | 5 | 2 |" in (tmp_path / "out" / "results.md").read_text()


def test_columns_can_be_built_directly(result):
    t = result.records
    built = RequestTable.from_columns(index=t.index, phase=t.phase, cls=t.cls, prompt_tokens=t.prompt_tokens,
                                      output_tokens=t.output_tokens, sent_s=t.sent_s, status=t.status,
                                      ttft_s=t.ttft_s, e2e_s=t.e2e_s)
    assert len(built) == 10 and built[7].error is None and built[0].ttft_s == 0.1
    assert built[0].server_prompt_tokens is None and built[0].itl_mean_s is None
    with pytest.raises(ValueError, match="differ in length"):
        RequestTable.from_columns(index=np.arange(3), phase=t.phase, cls=t.cls, prompt_tokens=t.prompt_tokens,
                                  output_tokens=t.output_tokens, sent_s=t.sent_s, status=t.status,
                                  ttft_s=t.ttft_s, e2e_s=t.e2e_s)


def test_markdown_tables(result):
    text = markdown(summarize(result, slo={"short": 0.25, "long": 2}, by_phase=True))
    assert text.startswith("## hand") and "workload w" in text
    assert "| short | 7 | 5 | 2 | 300 | 460 | 496 |" in text
    assert "28.6% (≤ 250 ms)" in text
    assert "short: stream error ×1, HTTP 503 ×1; long: no response ×1" in text
    assert "### phase one" in text and "### phase two" in text


def test_a_partial_run_says_so_in_its_results_md(result, tmp_path):
    """An interrupted `laps bench run` keeps its results; results.md, read later, must not pass
    for a complete run (it used to show only the sent requests' table)."""
    cut = RunResult({**result.meta, "interrupted": True, "planned_requests": 133, "sent_requests": 10},
                    result.records)
    save(cut, tmp_path / "cut", plots=False)
    assert "**Interrupted**: 10 of 133 planned requests were sent" in (tmp_path / "cut" / "results.md").read_text()
    assert "**Interrupted**: 10 of 133" in markdown(summarize(load_result(tmp_path / "cut")))  # loaded back
    assert "Interrupted" not in markdown(summarize(result))  # a complete run


def test_compare_markdown_shows_ratios_to_the_first_configuration(result):
    faster = RunResult({**result.meta, "label": "fast"},
                       [ok(r.index, r.cls, r.ttft_s * 0.42) if r.ok else r for r in result.records])
    text = compare_markdown([("fifo", summarize(result)), ("laps", summarize(faster))])
    assert "Baseline: **fifo**" in text and "### TTFT p50 (ms)" in text
    assert "| fifo | 300 | 2000 |" in text
    assert "| laps | 126 (0.42×) | 840 (0.42×) |" in text


def test_plots_are_pngs_of_the_documented_size(result, tmp_path):
    paths = save(result, tmp_path)
    for name in ("ttft_cdf", "ttft_timeline", "groups_timeline"):
        with Image.open(paths[name]) as image:
            image.verify()
        with Image.open(paths[name]) as image:
            assert image.format == "PNG" and image.size == (FIGSIZE[0] * DPI, FIGSIZE[1] * DPI)


def test_no_timeline_no_groups_plot_and_empty_runs_still_save(tmp_path):
    empty = RunResult({"label": "empty"}, [])
    paths = save(empty, tmp_path)
    assert "groups_timeline" not in paths and paths["ttft_cdf"].exists()
    assert summarize(empty).classes["all"].sent == 0
    assert len(load_result(tmp_path).records) == 0
