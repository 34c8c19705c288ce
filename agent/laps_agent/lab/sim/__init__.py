"""`laps sim`: a discrete-event simulation of a whole PD cluster, on the product's own code.

The same workload files and the same result files as `laps bench run`; the engines are the
emulated engine's model with the same profiles (see cluster.py for what runs and what is not
modelled), so a simulation and a `laps local --engine emulated` run of one workload agree.

    laps sim --workload lmsys-steady --profile gpu-h200-qwen2.5-32b --prefill 256 --decode 64 \\
             --systems vanilla-pd,laps --load 0.7
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from pathlib import Path

from laps_agent.emulated.profile import Profile, ProfileError, load_profile
from laps_agent.lab.matrix.spec import MatrixError, available_matrices, load_matrix
from laps_agent.lab.results import compare_markdown, markdown, moves_by_phase, phases_markdown, save, summarize
from laps_agent.lab.results.turns import summarize_turns, turns_report
from laps_agent.lab.sim import allocation, sizing
from laps_agent.lab.sim.cluster import HOP_S
from laps_agent.lab.sim.matrix import MatrixRun, run_matrix, save_partial
from laps_agent.lab.sim.run import ORACLE, mean_rate, measure_capacity, sim_system, simulate
from laps_agent.lab.workload.plan import Plan, plan_requests, require_requests, warmup_plan
from laps_agent.lab.workload.spec import WorkloadError, load_workload
from laps_agent.local.engines import unknown_engine_args
from laps_agent.policy.systems import SYSTEMS, SystemConfig, policy_config
from laps_agent.serving.flag_types import (
    flag_given,
    names,
    non_negative,
    output_dir,
    positive,
    slo_seconds,
    unwritable_dir,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laps sim", description=__doc__.split("\n")[0],
                                epilog="Other flags are passed to every engine model (as the emulated engine takes them: --context-length, --kv-pages, ...).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--workload", help="workload YAML file or built-in name")
    what.add_argument("--matrix", help=f"a matrix YAML file or built-in name ({', '.join(available_matrices())}): its systems over "
                      "its cells (workloads x profiles x shapes x loads), reported against the first system; "
                      "--systems, --slo, --max-requests and --seed replace the matrix's")
    p.add_argument("--profile", default="cpu-smollm2", help="engine profile name or YAML file")
    p.add_argument("--prefill", type=positive(int), default=8)
    p.add_argument("--decode", type=positive(int), default=2)
    p.add_argument("--systems", type=names, default=["laps"], help=f"comma-separated, the first is the baseline "
                   f"of the comparison ({', '.join(SYSTEMS)}; and {ORACLE.name}: a reference with an "
                   f"unlimited prefix cache shared by all prefill pods, for multi-turn workloads)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate-scale", type=positive(float), default=None, help="multiply every phase's rate")
    load.add_argument("--load", type=positive(float), default=None,
                      help="set the mean rate to this fraction of vanilla-pd's simulated capacity")
    p.add_argument("--max-requests", type=positive(int), default=None)
    p.add_argument("--seed", type=non_negative(int), default=None, help="override the workload's seed")
    # 0 is a threshold of 0 (every prompt long), not "not given"
    p.add_argument("--threshold", type=non_negative(int), default=None, help="default: the workload's (256)")
    p.add_argument("--slo", type=slo_seconds, default=None, help="TTFT SLOs, e.g. short=0.5,long=5")
    p.add_argument("--out", type=output_dir, default=None, help="result directory (default sim-results/<time>)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots (large runs)")
    p.add_argument("--hop-ms", type=non_negative(float), default=HOP_S * 1000,
                   help="one network hop (5 on a request's way to its first token); default 1 ms")
    p.add_argument("--warmup-s", type=non_negative(float), default=0.0,
                   help="replay the first phase this long first, as `laps bench compare` does")
    allocation.add_flags(p)
    sizing.add_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args, engine_args = build_parser().parse_known_args(argv)
    try:
        return _main(args, engine_args, argv)
    except KeyboardInterrupt:  # while planning or measuring the capacity: nothing simulated yet
        print("laps sim: interrupted", file=sys.stderr)
        return 130


# What a matrix sets per cell: flags that cannot go with --matrix.
_CELL_FLAGS = ("--profile", "--prefill", "--decode", "--threshold", "--load", "--rate-scale", "--warmup-s")


def _main(args: argparse.Namespace, engine_args: list[str], argv: list[str] | None = None) -> int:
    if args.matrix is not None:
        if args.autoscale:
            print("laps sim: error: --autoscale sizes the pools of one workload's run: give --workload, "
                  "not --matrix", file=sys.stderr)
            return 2
        return _main_matrix(args, engine_args, sys.argv[1:] if argv is None else argv)
    try:
        spec = load_workload(args.workload)
        if args.seed is not None:
            spec = spec.model_copy(update={"seed": args.seed})
        profile = load_profile(args.profile)
        systems = [sim_system(name.strip()) for name in args.systems]
        if args.allocation is not None:
            systems = [dataclasses.replace(s, allocation=args.allocation) for s in systems]
    except (WorkloadError, ProfileError, ValueError) as exc:
        print(f"laps sim: error: {exc}", file=sys.stderr)
        return 2
    # Now, not once planned: the engine models would refuse a flag behind laps engine's usage text.
    if problem := unknown_engine_args(engine_args, "laps sim") or allocation.flags_problem(args, systems):
        print(f"laps sim: error: {problem}", file=sys.stderr)
        return 2
    out = args.out or Path("sim-results") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if problem := unwritable_dir(out):  # found now, not after minutes of simulation
        print(f"laps sim: error: cannot write the results to {out}: {problem} (give --out DIR)", file=sys.stderr)
        return 2
    threshold = spec.threshold if args.threshold is None else args.threshold
    rate_scale = 1.0 if args.rate_scale is None else args.rate_scale
    try:  # planning reads the jsonl files and sizes the phases: their errors, not tracebacks
        if args.load is not None:
            rate = mean_rate(spec)  # first: a workload that plans nothing has no mix to measure
            capacity = measure_capacity(spec, profile, prefill=args.prefill, decode=args.decode,
                                        threshold=threshold, engine_args=tuple(engine_args))
            rate_scale = args.load * capacity / rate
            print(f"capacity of vanilla-pd on this mix: {capacity:.1f} req/s; running at {args.load:.0%} "
                  f"= {args.load * capacity:.1f} req/s (rate x{rate_scale:.3f})")
        plan = require_requests(plan_requests(spec, rate_scale=rate_scale, max_requests=args.max_requests))
        warmup = warmup_plan(spec, args.warmup_s, rate_scale=rate_scale)
    except WorkloadError as exc:
        print(f"laps sim: error: {exc}", file=sys.stderr)
        return 2
    if args.autoscale:
        if len(systems) != 1:
            print("laps sim: error: --autoscale runs one system under each scaler: give one in --systems",
                  file=sys.stderr)
            return 2
        try:
            return sizing.run_sizing(args, engine_args, plan, profile, systems[0], threshold, out)
        except ValueError as exc:   # limits the planner refuses (a budget below the minimum pools)
            print(f"laps sim: error: {exc}", file=sys.stderr)
            return 2
    labelled, turns = [], []
    try:
        _simulate_all(args, engine_args, plan, warmup, profile, systems, threshold, out, labelled, turns)
    except KeyboardInterrupt:  # the systems simulated before are saved (one directory each)
        print(f"laps sim: interrupted after {len(labelled)} of {len(systems)} system(s)"
              + (f"; theirs are saved in {out}" if labelled else ""), file=sys.stderr)
        return 130
    except OSError as exc:  # a full disk, a directory removed under the run
        print(f"laps sim: error: cannot write the results: {exc}", file=sys.stderr)
        return 1
    if len(labelled) > 1:
        print("\n" + compare_markdown([(label, summary) for label, summary, _ in labelled]))
        per_phase = phases_markdown(labelled)
        if per_phase:
            print("\n## per phase\n\n" + per_phase)
    if (plan.conversation >= 0).any():
        print_turns(turns)
    return 0


def _simulate_all(args: argparse.Namespace, engine_args: list[str], plan: Plan, warmup: Plan | None,
                  profile: Profile, systems: list[SystemConfig], threshold: int, out: Path,
                  labelled: list, turns: list) -> None:
    """Simulate and save each system in turn; `labelled` and `turns` get one entry per system
    done (what main reports, also after Ctrl-C)."""
    for sys_config in systems:
        result = simulate(plan, profile, sys_config, prefill=args.prefill, decode=args.decode,
                          threshold=threshold, engine_args=tuple(engine_args), warmup=warmup,
                          hop_s=args.hop_ms / 1000, allocation_config=policy_config(args),
                          interval_s=args.allocation_interval, ttft_slo_s=args.slo)
        result.meta["slo"] = args.slo
        paths = save(result, out / sys_config.name if len(systems) > 1 else out, slo=args.slo,
                     plots=not args.no_plots)
        summary = summarize(result, slo=args.slo, by_phase=len(plan.phases) > 1)
        labelled.append((sys_config.name, summary, moves_by_phase(result)))
        turns.append((sys_config.name, summarize_turns(result)))
        print(f"\n## {sys_config.name}: {len(plan)} requests, {args.prefill} prefill + {args.decode} decode, "
              f"profile {profile.name}; simulated {result.meta['duration_s']:.0f} s in "
              f"{result.meta['sim_wall_s']:.1f} s\n")
        print(markdown(summary))
        print(f"\nfiles: {', '.join(str(v) for v in paths.values())}", flush=True)


def _main_matrix(args: argparse.Namespace, engine_args: list[str], argv: list[str]) -> int:
    """`laps sim --matrix`: lab/sim/matrix.py runs it."""
    given = [flag for flag in _CELL_FLAGS if flag_given(flag, argv)]
    if given:
        print(f"laps sim: error: {', '.join(given)} cannot go with --matrix: the matrix sets "
              f"{'it' if len(given) == 1 else 'them'} per cell (profiles, shapes, loads)", file=sys.stderr)
        return 2
    try:
        matrix = load_matrix(args.matrix, args.seed)
        chosen = args.systems if flag_given("--systems", argv) else matrix.systems
        systems = [sim_system(name) for name in chosen]
        for profile in matrix.spec.profiles:
            load_profile(profile)
    except (MatrixError, ProfileError, ValueError) as exc:
        print(f"laps sim: error: {exc}", file=sys.stderr)
        return 2
    smallest = argparse.Namespace(**{**vars(args), "prefill": min(c.shape.prefill for c in matrix.cells())})
    if problem := unknown_engine_args(engine_args, "laps sim") or allocation.flags_problem(smallest, systems):
        print(f"laps sim: error: {problem}", file=sys.stderr)
        return 2
    out = args.out or Path("sim-results") / datetime.datetime.now().strftime("matrix-%Y%m%d-%H%M%S")
    if problem := unwritable_dir(out):
        print(f"laps sim: error: cannot write the results to {out}: {problem} (give --out DIR)", file=sys.stderr)
        return 2
    print(f"matrix {matrix.spec.name}: {len(matrix.cells())} cells x {len(systems)} systems "
          f"({', '.join(chosen)}; baseline {chosen[0]})", flush=True)
    state = MatrixRun({})
    try:
        run_matrix(matrix, out, systems=chosen, slo=args.slo, max_requests=args.max_requests,
                   engine_args=engine_args, hop_s=args.hop_ms / 1000, allocation=args.allocation,
                   allocation_config=policy_config(args), interval_s=args.allocation_interval,
                   plots=not args.no_plots, state=state, log=lambda line: print(line, flush=True))
    except KeyboardInterrupt:  # the cells done are reported and saved
        done = save_partial(state, out, chosen)
        print(f"laps sim: interrupted after {done} cell(s)" + (f"; theirs are saved in {out}" if done else ""),
              file=sys.stderr)
        return 130
    except WorkloadError as exc:
        print(f"laps sim: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"laps sim: error: cannot write the results: {exc}", file=sys.stderr)
        return 1
    return 0


def print_turns(turns: list) -> None:
    """Multi-turn table and issue 12's targets (results.turns.turns_report)."""
    print("\n" + turns_report(turns))
