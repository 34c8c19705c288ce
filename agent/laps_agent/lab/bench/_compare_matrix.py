"""`laps bench compare --matrix FILE`: a matrix's systems over its cells over HTTP, and the same
cells simulated, so that a user sees on their own machine whether the simulator's verdicts hold.

Each cell's systems run one after another through `laps local --engine emulated` with the cell's
profile and shape, on the requests `laps sim --matrix` plans for that cell (lab/sim/matrix.py's
CellPlanner: the same rate, the same shortened workload, the same seed). The report is the
simulator's (matrix.json, matrix.md, the heatmap: report.py), from the HTTP runs, plus each cell
simulated on the same plan (`sim` in matrix.json) and their agreement (report.agreement: each
system's TTFT p90 ratios to the baseline, measured against simulated). Each system's records are
kept in `cell-NN/<system>/`.

Cells run in real time: a cell of N requests at R req/s takes about N/R seconds per system, plus
each `laps local`'s start-up and the warm-up; size the matrix (max_requests, shapes, loads) to
what the machine carries: every emulated engine is a process, and the HTTP hops are milliseconds
that the simulator does not model. Ctrl-C saves the cells finished and exits 130.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

from laps_agent.emulated.profile import ProfileError, load_profile
from laps_agent.lab.bench._compare_system import run_system, systems_problem
from laps_agent.lab.bench.run import RESULTS_DIR
from laps_agent.lab.matrix.report import agreement, agreement_markdown, cell_metrics, with_ratios
from laps_agent.lab.matrix.spec import MatrixError, load_matrix
from laps_agent.lab.results import save
from laps_agent.lab.sim.matrix import CellPlanner, MatrixRun, cell_line, finish_report, save_partial, simulate_cell
from laps_agent.lab.sim.run import sim_system
from laps_agent.lab.workload import WorkloadError
from laps_agent.lab.workload.plan import warmup_plan
from laps_agent.modelio.model_files import default_model_path
from laps_agent.modelio.tokenizer import load_tokenizer
from laps_agent.policy.systems import system
from laps_agent.serving.flag_types import flag_given

# What a matrix sets per cell: flags that cannot go with --matrix.
CELL_FLAGS = ("--workload", "--profile", "--prefill", "--decode", "--load", "--rate-scale")


def _error(message: str) -> int:
    print(f"laps bench compare: error: {message}", file=sys.stderr)
    return 2


def main_matrix(args: argparse.Namespace, engine_args: list[str], argv: list[str]) -> int:
    if given := [flag for flag in CELL_FLAGS if flag_given(flag, argv)]:
        return _error(f"{', '.join(given)} cannot go with --matrix: the matrix sets "
                      f"{'it' if len(given) == 1 else 'them'} per cell")
    if args.engine != "emulated":
        return _error("--matrix runs emulated engines (--engine emulated): its cells are sized by the "
                      "matrix's profiles, which only emulated engines follow")
    try:
        matrix = load_matrix(args.matrix, args.seed)
        names = list(args.systems if flag_given("--systems", argv) else matrix.systems)
        systems = [system(name) for name in names]
        for profile in matrix.spec.profiles:
            load_profile(profile)
    except (MatrixError, ProfileError, ValueError) as exc:
        return _error(str(exc))
    cells = matrix.cells()
    smallest = min(cells, key=lambda c: c.shape.prefill)
    out = args.out or RESULTS_DIR / (datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + "-compare-matrix")
    slo = dict(args.slo or matrix.spec.slo)
    if problem := systems_problem(_cell_args(args, smallest, slo), systems, engine_args, out):
        return _error(problem)
    try:
        tokenizer = load_tokenizer(args.model or default_model_path())
    except (ValueError, OSError) as exc:  # TokenizerError is a ValueError
        return _error(f"cannot load the tokenizer: {exc}")
    budget = args.max_requests or matrix.spec.max_requests
    print(f"matrix {matrix.spec.name}: {len(cells)} cells x {len(systems)} systems over HTTP "
          f"({', '.join(names)}; baseline {names[0]}), each cell also simulated", flush=True)
    run = MatrixRun({"name": matrix.spec.name, "origin": matrix.origin, "tool": "laps bench compare",
                     "systems": names, "slo": slo, "max_requests": budget, "cells": [], "summary": {}})
    planner = CellPlanner(matrix, budget, engine_args)
    configs = [sim_system(name) for name in names]
    for k, cell in enumerate(cells, 1):
        started = time.perf_counter()
        try:
            planned = planner.plan(cell, tokenizer)
            plans = (planned.plan, warmup_plan(planned.spec, args.warmup_s, rate_scale=planned.rate_scale,
                                               tokenizer=tokenizer))
        except WorkloadError as exc:
            return _error(f"cell {matrix.label(cell)}: {exc}")
        entry = planned.entry
        for sys_config in systems:
            where = out / f"cell-{k:02d}" / sys_config.name
            try:
                result = run_system(_cell_args(args, cell, slo), sys_config, engine_args, where, planned.spec, plans,
                                    planned.rate_scale, tokenizer)
            except RuntimeError as exc:
                print(f"laps bench compare: {matrix.label(cell)}: {sys_config.name}: {exc}", file=sys.stderr)
                return 1
            if result is None or result.meta.get("interrupted"):
                return _interrupted(run, out, names)
            result.meta.update(slo=slo, system=sys_config.name, engine="emulated", profile=cell.profile,
                               cluster={"prefill": cell.shape.prefill, "decode": cell.shape.decode})
            save(result, where, slo=slo)
            entry["systems"][sys_config.name] = cell_metrics(result, slo)
        with_ratios(entry, names)
        entry["sim"] = with_ratios({"systems": simulate_cell(planned, configs, slo, engine_args=engine_args)},
                                   names)["systems"]
        run.report["cells"].append(entry)
        print(cell_line(k, len(cells), entry, names, time.perf_counter() - started), flush=True)
    run.report["agreement"] = agreement(run.report)
    finish_report(run, out, names, plots=True, log=lambda line: print(line, flush=True))
    print("\n" + agreement_markdown(run.report["agreement"]), flush=True)
    return 0


def _cell_args(args: argparse.Namespace, cell, slo: dict) -> argparse.Namespace:
    """The command-line arguments of one cell's systems: its shape, profile and SLOs."""
    return argparse.Namespace(**{**vars(args), "prefill": cell.shape.prefill, "decode": cell.shape.decode,
                                 "profile": cell.profile, "slo": slo})


def _interrupted(run: MatrixRun, out: Path, names: list[str]) -> int:
    done = save_partial(run, out, names)
    print(f"laps bench compare: interrupted after {done} cell(s)" + (f"; theirs are saved in {out}" if done else ""),
          file=sys.stderr)
    return 130
