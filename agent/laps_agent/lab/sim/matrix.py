"""`laps sim --matrix FILE`: every system of a matrix (laps_agent.lab.matrix) simulated in every
cell, and the report against the first system (lab/matrix/report.py).

A cell's workload runs at `load` x vanilla-pd's simulated capacity on its mix and shape
(`measure_capacity`, once per workload, profile and shape), shortened (all its phases alike) to
about the matrix's `max_requests`, which also caps it; a bursty phase keeps one whole period at
least, uncapped (a cell shorter than a period measured its first burst, not bursts). Every system
of a cell replays the same plan. Only the report is written (matrix.json, matrix.md,
matrix-heatmap.png), not each run's records.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from laps_agent.emulated.profile import Profile, load_profile
from laps_agent.lab.matrix.report import (
    agreement,
    cell_metrics,
    save_report,
    summarize,
    summary_markdown,
    targets,
    targets_markdown,
    with_ratios,
)
from laps_agent.lab.matrix.spec import Cell, CellSetup, Matrix, cell_setup, shortened, whole_periods
from laps_agent.lab.sim.allocation import INTERVAL_S
from laps_agent.lab.sim.cluster import HOP_S
from laps_agent.lab.sim.run import default_chars_per_token, measure_capacity, sim_system, simulate
from laps_agent.lab.workload import Plan, WorkloadSpec
from laps_agent.lab.workload.plan import plan_requests, require_requests
from laps_agent.policy.allocation import AllocationConfig
from laps_agent.policy.systems import SystemConfig


@dataclasses.dataclass
class MatrixRun:
    """What `run_matrix` has done so far (also after Ctrl-C): the report of the cells done."""
    report: dict
    paths: dict[str, Path] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PlannedCell:
    """One cell as every driver runs it: its setup, profile, shortened workload, rate scale and
    plan (the same requests for every system), and the report entry's head."""
    setup: CellSetup
    profile: Profile
    spec: WorkloadSpec
    rate_scale: float
    plan: Plan
    entry: dict


class CellPlanner:
    """Plans a matrix's cells (module docstring): vanilla-pd's capacity once per workload,
    profile and shape, the workload shortened to about `budget` requests. `laps sim --matrix`
    and `laps bench compare --matrix` plan with it, so both run the same requests per cell."""

    def __init__(self, matrix: Matrix, budget: int, engine_args: Sequence[str] = ()) -> None:
        self.matrix, self.budget, self.engine_args = matrix, budget, tuple(engine_args)
        self._profiles: dict[str, Profile] = {}
        self._capacities: dict[tuple, float] = {}

    def plan(self, cell: Cell, tokenizer=None) -> PlannedCell:
        """`tokenizer`: to give the requests prompt text (HTTP drivers)."""
        setup = cell_setup(self.matrix, cell)
        profile = self._profiles.get(setup.profile) or self._profiles.setdefault(setup.profile,
                                                                               load_profile(setup.profile))
        spec, threshold = setup.spec, setup.spec.threshold
        key = (cell.workload, cell.profile, cell.shape)
        if key not in self._capacities:
            self._capacities[key] = measure_capacity(spec, profile, prefill=setup.prefill, decode=setup.decode,
                                                     threshold=threshold, engine_args=self.engine_args)
        capacity = self._capacities[key]
        base = require_requests(plan_requests(spec))
        rate_scale = setup.load * capacity / (len(base) / base.duration_s)
        factor = self.budget / (len(base) * rate_scale)
        spec = shortened(spec, factor)
        cap = None if whole_periods(setup.spec, factor) else self.budget
        plan = require_requests(plan_requests(spec, rate_scale=rate_scale, max_requests=cap, tokenizer=tokenizer))
        entry = {"label": self.matrix.label(cell), "workload": cell.workload, "profile": cell.profile,
                 "shape": cell.shape.name, "prefill": setup.prefill, "decode": setup.decode, "load": setup.load,
                 "capacity": capacity, "rate": setup.load * capacity, "requests": len(plan),
                 "threshold": threshold, "seed": spec.seed, "multi_turn": bool((plan.conversation >= 0).any()),
                 "systems": {}}
        return PlannedCell(setup, profile, spec, rate_scale, plan, entry)


def simulate_cell(cell: PlannedCell, configs: Sequence[SystemConfig], slo: dict, *, engine_args: Sequence[str] = (),
                  chars_per_token: float | None = None, hop_s: float = HOP_S,
                  allocation_config: AllocationConfig | None = None, interval_s: float = INTERVAL_S) -> dict:
    """Each system's cell metrics (report.cell_metrics) of one simulated run of the cell's plan."""
    out = {}
    for config in configs:
        result = simulate(cell.plan, cell.profile, config, prefill=cell.setup.prefill, decode=cell.setup.decode,
                          threshold=cell.spec.threshold, engine_args=tuple(engine_args),
                          chars_per_token=chars_per_token, hop_s=hop_s, allocation_config=allocation_config,
                          interval_s=interval_s, ttft_slo_s=slo)
        out[config.name] = cell_metrics(result, slo)
    return out


def run_matrix(matrix: Matrix, out: Path, *, systems: Sequence[str] | None = None, slo: dict | None = None,
               max_requests: int | None = None, engine_args: Sequence[str] = (), hop_s: float = HOP_S,
               allocation: str | None = None, allocation_config: AllocationConfig | None = None,
               interval_s: float = INTERVAL_S, plots: bool = True, state: MatrixRun | None = None,
               log: Callable[[str], None] = print) -> MatrixRun:
    """Simulate the matrix and write its report into `out`. `systems`, `slo`, `max_requests`:
    instead of the matrix's (as `laps sim`'s flags give them); `allocation`: every system's."""
    names = list(systems or matrix.systems)
    configs = [sim_system(n) for n in names]
    if allocation is not None:
        configs = [dataclasses.replace(s, allocation=allocation) for s in configs]
    slo = dict(slo or matrix.spec.slo)
    budget = max_requests or matrix.spec.max_requests
    run = state or MatrixRun({})
    run.report.update(name=matrix.spec.name, origin=matrix.origin, systems=names, slo=slo, max_requests=budget,
                      cells=[], summary={})
    chars = default_chars_per_token() if any(s.estimator == "chars4" for s in configs) else None
    planner = CellPlanner(matrix, budget, engine_args)
    cells = matrix.cells()
    for k, cell in enumerate(cells, 1):
        started = time.perf_counter()
        planned = planner.plan(cell)
        entry = planned.entry
        entry["systems"] = simulate_cell(planned, configs, slo, engine_args=engine_args, chars_per_token=chars,
                                         hop_s=hop_s, allocation_config=allocation_config, interval_s=interval_s)
        run.report["cells"].append(with_ratios(entry, names))
        log(cell_line(k, len(cells), entry, names, time.perf_counter() - started))
    finish_report(run, out, names, plots, log)
    return run


def finish_report(run: MatrixRun, out: Path, names: list[str], plots: bool, log: Callable[[str], None]) -> None:
    """The summary and targets of the cells run, saved into `out` and logged."""
    run.report["summary"] = summarize(run.report["cells"], names)
    # The targets of `laps` (issue "LAPS that never loses"), when it runs against another baseline.
    held = [n for n in names[1:] if n == "laps"]
    run.report["targets"] = {n: targets(run.report, n) for n in held}
    run.paths = save_report(run.report, out, plots=plots)
    log("\n" + summary_markdown(run.report["summary"], names[0]))
    for n in held:
        log("\n" + targets_markdown(run.report["targets"][n], n))
    log(f"\nfiles: {', '.join(str(p) for p in run.paths.values())}")


def save_partial(run: MatrixRun, out: Path, names: list[str]) -> int:
    """After Ctrl-C: the report of the cells done so far (summary, and the agreement where the
    cells hold one), saved without plots; how many there are."""
    done = run.report.get("cells", [])
    if done:
        run.report["summary"] = summarize(done, names)
        if any("sim" in cell for cell in done):
            run.report["agreement"] = agreement(run.report)
        save_report(run.report, out, plots=False)
    return len(done)


def cell_line(k: int, n: int, entry: dict, names: list[str], wall: float) -> str:
    """One line per cell as it ends: each system's SLO attainment short/long (%)."""
    def att(m: dict, c: str) -> str:
        a = m[c]["attainment"]
        return "–" if a is None else f"{100 * a:.0f}"
    figures = "  ".join(f"{name} {att(entry['systems'][name], 'short')}/{att(entry['systems'][name], 'long')}"
                        for name in names)
    return f"[{k}/{n}] {entry['label']} ({entry['requests']} req, {wall:.1f} s): SLO % short/long: {figures}"
