"""`laps bench compare`: the same workload and seed against several serving systems, one after
another on this machine, each after a warm-up, with every figure as a ratio to the first.

Each system (laps_agent.policy.systems: vanilla-pd, reference, laps) is started with `laps local`
(emulated engines with `--engine emulated --profile P`, or real CPU engines) and measured with
`laps bench run`'s load generator in-process. The warm-up replays the workload's first phase
with another seed for --warmup-s seconds (connections, caches, and the allocation loop settle),
then the measured run starts. --load F sets the mean rate to F times the capacity of vanilla-pd
on this workload's length mix, as `laps sim` measures it with the same profile (exact for
emulated engines; for real engines an estimate from the fitted profile, which is printed).
Ctrl-C (or SIGTERM) ends the comparison with what it has: the systems measured so far, the
current one's partial run included, are saved and compared, and the exit code is 130.

    laps bench compare --workload lmsys-steady --engine emulated --profile gpu-h200-qwen2.5-32b \\
        --prefill 8 --decode 2 --load 0.7 --slo short=0.3,long=1.5
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from laps_agent.emulated.profile import ProfileError, load_profile
from laps_agent.lab.bench._compare_matrix import main_matrix
from laps_agent.lab.bench._compare_system import run_system, systems_problem
from laps_agent.lab.bench.run import RESULTS_DIR
from laps_agent.lab.matrix.spec import available_matrices
from laps_agent.lab.results import compare_markdown, markdown, moves_by_phase, phases_markdown, save, summarize
from laps_agent.lab.results.turns import summarize_turns, turns_report
from laps_agent.lab.sim.run import mean_rate, measure_capacity
from laps_agent.lab.workload import WorkloadError, load_workload, plan_requests
from laps_agent.lab.workload.plan import require_requests, warmup_plan
from laps_agent.modelio.model_files import default_model_path
from laps_agent.modelio.tokenizer import load_tokenizer
from laps_agent.policy.systems import SIM_ONLY, SYSTEMS, system
from laps_agent.serving.flag_types import names, non_negative, output_dir, positive, slo_seconds

DEFAULT_SYSTEMS = ["vanilla-pd", "reference", "laps"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laps bench compare", description=__doc__.split("\n\n")[0],
                                epilog="Other flags are passed to every engine of every system.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--workload", help="workload YAML file or built-in name")
    what.add_argument("--matrix", help=f"a matrix YAML file or built-in name ({', '.join(available_matrices())}), "
                      "as laps sim --matrix: its systems "
                      "over its cells, on emulated engines of each cell's profile and shape, each cell also "
                      "simulated and the two compared; --systems, --slo, --max-requests and --seed replace "
                      "the matrix's")
    p.add_argument("--systems", type=names, default=DEFAULT_SYSTEMS,
                   help=f"comma-separated; ratios are against the first "
                   f"({', '.join(n for n in SYSTEMS if n not in SIM_ONLY)})")
    p.add_argument("--engine", choices=("emulated", "builtin"), default="emulated")
    p.add_argument("--profile", default=None, help="emulated engines' profile (default cpu-smollm2); "
                   "also the profile --load estimates capacity with")
    p.add_argument("--model", default=None, help="model (builtin) or tokenizer (emulated) path")
    p.add_argument("--prefill", type=positive(int), default=8)
    p.add_argument("--decode", type=positive(int), default=2)
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate-scale", type=positive(float), default=None, help="multiply every phase's rate")
    load.add_argument("--load", type=positive(float), default=None, help="mean rate as a fraction of vanilla-pd's capacity")
    p.add_argument("--seed", type=non_negative(int), default=None, help="override the workload's seed")
    p.add_argument("--max-requests", type=positive(int), default=None)
    p.add_argument("--warmup-s", type=non_negative(float), default=30.0, help="warm-up seconds per system (0: none)")
    p.add_argument("--slo", type=slo_seconds, default=None, help="per-class TTFT SLOs, e.g. short=0.3,long=2")
    p.add_argument("--timeout", type=positive(float, finite=False), default=300.0, help="per-request timeout, seconds")
    p.add_argument("--startup-timeout", type=positive(float), default=600.0)
    p.add_argument("--out", type=output_dir, default=None, help="default bench-results/<time>-compare")
    return p


def main(argv: list[str] | None = None) -> int:
    args, engine_args = build_parser().parse_known_args(argv)
    if args.matrix is not None:
        return main_matrix(args, engine_args, list(sys.argv[1:] if argv is None else argv))
    try:
        spec = load_workload(args.workload)
        if args.seed is not None:
            spec = spec.model_copy(update={"seed": args.seed})
        systems = [system(name) for name in args.systems]
    except (WorkloadError, ValueError) as exc:
        print(f"laps bench compare: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or RESULTS_DIR / (datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + "-compare")
    if problem := systems_problem(args, systems, engine_args, out):
        print(f"laps bench compare: error: {problem}", file=sys.stderr)
        return 2

    rate_scale = args.rate_scale or 1.0
    try:  # as `laps bench run` says a tokenizer it cannot read (a bad --model)
        tokenizer = load_tokenizer(args.model or default_model_path())
    except (ValueError, OSError) as exc:  # TokenizerError is a ValueError
        print(f"laps bench compare: error: cannot load the tokenizer: {exc}", file=sys.stderr)
        return 2
    try:  # planned once, before any system starts (a bad jsonl line, a phase too large: refused
        # here), and the same plan serves every system
        # The profile is read here too, so a bad one is not met in every system's engine logs.
        profile = load_profile(args.profile) if args.engine == "emulated" or args.load is not None else None
        if args.load is not None:
            rate = mean_rate(spec)  # first: a workload that plans nothing has no mix to measure
            capacity = measure_capacity(spec, profile, prefill=args.prefill, decode=args.decode,
                                        threshold=spec.threshold, engine_args=tuple(engine_args))
            rate_scale = args.load * capacity / rate
            how = "exact for these engines" if args.engine == "emulated" else "an estimate for real engines"
            print(f"[compare] capacity of vanilla-pd on this mix (simulated with profile {profile.name}, {how}): "
                  f"{capacity:.1f} req/s; running at {args.load:.0%} = {args.load * capacity:.1f} req/s "
                  f"(rate x{rate_scale:.3f})", flush=True)
        plans = (require_requests(plan_requests(spec, rate_scale=rate_scale, max_requests=args.max_requests,
                                                tokenizer=tokenizer)),
                 warmup_plan(spec, args.warmup_s, rate_scale=rate_scale, tokenizer=tokenizer))
    except (WorkloadError, ProfileError) as exc:
        print(f"laps bench compare: error: {exc}", file=sys.stderr)
        return 2
    labelled, turns = [], []
    for sys_config in systems:
        try:
            result = run_system(args, sys_config, engine_args, out / sys_config.name, spec, plans, rate_scale,
                                tokenizer)
        except RuntimeError as exc:
            print(f"laps bench compare: {sys_config.name}: {exc}", file=sys.stderr)
            return 1
        if result is None:
            print(f"[compare] interrupted before {sys_config.name} was measured", flush=True)
            return _finish(labelled, turns, out, interrupted=True)
        result.meta.update(slo=args.slo, system=sys_config.name, engine=args.engine, profile=args.profile,
                           cluster={"prefill": args.prefill, "decode": args.decode})
        save(result, out / sys_config.name, slo=args.slo)
        summary = summarize(result, slo=args.slo, by_phase=len(result.meta.get("phases") or []) > 1)
        labelled.append((sys_config.name, summary, moves_by_phase(result) if result.timeline else None))
        if "prefix" in result.meta:  # a workload with conversations (issue 12)
            turns.append((sys_config.name, summarize_turns(result)))
        print(f"\n## {sys_config.name}\n\n{markdown(summary)}\n", flush=True)
        if result.meta["interrupted"]:
            return _finish(labelled, turns, out, interrupted=True)
    return _finish(labelled, turns, out)


def _finish(labelled: list, turns: list, out: Path, interrupted: bool = False) -> int:
    """compare.md and the table of the systems measured; after Ctrl-C, of those measured so far
    (the last one partial) and exit code 130."""
    if not labelled:
        print("laps bench compare: interrupted: no system was measured", file=sys.stderr)
        return 130
    table = compare_markdown([(label, summary) for label, summary, _ in labelled])
    per_phase = phases_markdown(labelled)
    if per_phase:
        table += "\n\n## per phase\n\n" + per_phase
    if turns:
        table += "\n\n" + turns_report(turns)
    if interrupted:
        table = (f"**Interrupted** after {len(labelled)} system(s); the last one's run is partial "
                 "(see its results.md).\n\n" + table)
    (out / "compare.md").write_text(table + "\n")
    print(table)
    print(f"\nresults: {out}")
    if interrupted:
        print("[compare] interrupted: the systems measured so far are saved", flush=True)
        return 130
    return 0
