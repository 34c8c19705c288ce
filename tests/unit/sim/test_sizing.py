"""`laps sim --autoscale`: the planner against static provisioning for the peak and the
utilisation-driven (HPA-style) baseline, deterministically simulated on the built-in moving
workloads with the H200 32B profile (issue 37's targets; the figures: docs/design/planner.md).

What holds here is asserted; where a target of the issue does not hold, the test pins what
does (and the design note says so): the diurnal day is 30 simulated minutes, start-up 120 s."""
from __future__ import annotations

import json

import pytest

from laps_agent.lab.sim import main as sim_main

COMMON = ["--profile", "gpu-h200-qwen2.5-32b", "--systems", "laps", "--gpu-budget", "16", "--prefill-max", "12",
          "--decode-max", "6", "--no-plots"]
ALL = ["--autoscale", "planner,utilisation,static"]
PLANNER = ["--autoscale", "planner"]   # where only the planner's figures are asserted


def _sizing(tmp_path, workload: str, *extra: str) -> dict[str, dict]:
    out = tmp_path / workload
    assert sim_main(["--workload", workload, *COMMON, *extra, "--out", str(out)]) == 0
    report = json.loads((out / "sizing.json").read_text())
    return {row["scaler"]: row for row in report["rows"]}


@pytest.fixture(scope="module")
def diurnal(tmp_path_factory):
    return _sizing(tmp_path_factory.mktemp("diurnal"), "diurnal", *ALL, "--prefill", "3", "--decode", "2")


def test_the_planner_meets_the_slos_through_a_day_with_fewer_gpu_seconds(diurnal):
    planner, static, hpa = diurnal["planner"], diurnal["static"], diurnal["utilisation"]
    for cls in ("short", "long"):
        assert planner[f"{cls}_attainment_outside_lag"] >= 0.99, planner
        assert planner[f"{cls}_refused"] == 0
        # The baseline, which knows no budget, went over it to attain as much (measured: short
        # 99.7% against its 99.9%, with 26 steps over 16 GPUs).
        assert planner[f"{cls}_attainment"] >= hpa[f"{cls}_attainment"] - 0.005
    assert hpa["over_budget"] > 0
    assert planner["gpu_seconds"] <= 0.85 * static["gpu_seconds"]     # measured 0.83x (the target, 0.7x, not met)
    assert planner["gpu_seconds"] <= 0.75 * hpa["gpu_seconds"]        # measured 0.70x
    assert planner["direction_changes_per_hour"] <= 4                 # N = 4 an hour: up, then down, per pool


def test_the_budget_is_never_exceeded_by_the_planner(diurnal):
    assert diurnal["planner"]["over_budget"] == 0 and diurnal["planner"]["max_gpus"] <= 16


def test_a_flash_crowd_is_answered_within_one_interval_and_served_after_the_lag(tmp_path):
    rows = _sizing(tmp_path, "flash-crowd", *PLANNER, "--prefill", "3", "--decode", "1")
    planner = rows["planner"]
    # The first decision after the crowd's first step (decisions run every 30 s from the first arrival).
    assert planner["first_step_after_crowd_s"] and all(s is not None and s <= 31 for s in
                                                       planner["first_step_after_crowd_s"])
    for cls in ("short", "long"):
        assert planner[f"{cls}_attainment_outside_lag"] >= 0.99, planner
    assert planner["over_budget"] == 0


def test_a_quiet_night_scales_to_the_minimum(tmp_path):
    rows = _sizing(tmp_path, "quiet-night", *PLANNER, "--prefill", "6", "--decode", "3")
    assert rows["planner"]["end"] == [1, 1]
    assert rows["planner"]["short_attainment"] >= 0.99 and rows["planner"]["long_attainment"] >= 0.99


def test_autoscale_takes_one_workload_and_one_system(tmp_path, capsys):
    assert sim_main(["--matrix", "small", "--autoscale", "planner", "--out", str(tmp_path / "m")]) == 2
    assert "--autoscale sizes the pools of one workload's run" in capsys.readouterr().err
    assert sim_main(["--workload", "quiet-night", "--systems", "laps,vanilla-pd", "--autoscale", "planner",
                     "--out", str(tmp_path / "s")]) == 2
    assert "give one in --systems" in capsys.readouterr().err
    assert sim_main(["--workload", "quiet-night", "--autoscale", "planner", "--gpu-budget", "1",
                     "--out", str(tmp_path / "b")]) == 2
    assert "cannot hold the minimum pools" in capsys.readouterr().err
