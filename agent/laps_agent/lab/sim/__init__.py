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
import time
from pathlib import Path

import numpy as np

from laps_agent.emulated.profile import Profile, ProfileError, load_profile
from laps_agent.lab.matrix.report import save_report
from laps_agent.lab.matrix.report import summarize as summarize_matrix
from laps_agent.lab.matrix.spec import MatrixError, load_matrix
from laps_agent.lab.results import (
    RequestTable,
    RunResult,
    compare_markdown,
    markdown,
    moves_by_phase,
    phases_markdown,
    save,
    summarize,
)
from laps_agent.lab.results.turns import ORACLE_LABEL, pod_load, summarize_turns, turns_report
from laps_agent.lab.sim import allocation
from laps_agent.lab.sim.cluster import HOP_S, SimCluster, chars4_estimate
from laps_agent.lab.workload.conversations import oracle_cached_tokens
from laps_agent.lab.workload.plan import Plan, plan_requests, require_requests, warmup_plan
from laps_agent.lab.workload.prompts import PromptBuilder
from laps_agent.lab.workload.spec import WorkloadError, WorkloadSpec, load_workload
from laps_agent.local.engines import unknown_engine_args
from laps_agent.modelio.model_files import default_model_path
from laps_agent.modelio.tokenizer import load_tokenizer
from laps_agent.policy.classes import LONG, SHORT, is_short
from laps_agent.policy.systems import SYSTEMS, SystemConfig, moves_pods, policy_config, system
from laps_agent.serving.flag_types import names, non_negative, output_dir, positive, slo_seconds, unwritable_dir

_CAPACITY_REQUESTS_PER_POD = 200
# The multi-turn reference, only here: `laps` over one unlimited prefix cache that every prefill
# pod shares and the router knows (prefix.py). Not a system `laps local` can run.
# The oracle router: every earlier prompt cached everywhere, and nothing more (no warming).
ORACLE = dataclasses.replace(SYSTEMS["laps"], name=ORACLE_LABEL, prefix_warm=False)


def sim_system(name: str) -> SystemConfig:
    return ORACLE if name == ORACLE.name else system(name)


def simulate(plan: Plan, profile: Profile, sys_config: SystemConfig, *, prefill: int, decode: int,
             threshold: int, engine_args: tuple[str, ...] = (), label: str | None = None,
             chars_per_token: float | None = None, warmup: Plan | None = None,
             hop_s: float = HOP_S, allocation_config: allocation.AllocationConfig | None = None,
             interval_s: float = allocation.INTERVAL_S) -> RunResult:
    """One simulated run of `plan` on a cluster running `sys_config`, after `warmup` (requests
    replayed first on the same cluster and left out of the result, as `laps bench compare` warms
    each system up). `chars_per_token`: of the load generator's prompt text, for the reference's
    chars/4 estimate (default: measured on the default tokenizer's prompt builder, as
    `laps bench run` builds prompts)."""
    estimate = None
    if sys_config.estimator == "chars4":
        estimate = chars4_estimate(chars_per_token or default_chars_per_token())
    cluster = SimCluster(profile, sys_config, prefill=prefill, decode=decode, threshold=threshold,
                         engine_args=engine_args, estimate=estimate, hop_s=hop_s, allocation=allocation_config,
                         interval_s=interval_s,
                         oracle=sys_config.name == ORACLE.name)
    skip, offset = 0, 0.0
    at, prompts, outputs_all, convs = plan.at, plan.prompt_tokens, plan.output_tokens, plan.conversation
    if warmup is not None and len(warmup):
        skip, offset = len(warmup), warmup.duration_s
        at = np.concatenate([warmup.at, plan.at + offset])
        prompts = np.concatenate([warmup.prompt_tokens, plan.prompt_tokens])
        outputs_all = np.concatenate([warmup.output_tokens, plan.output_tokens])
        # The warm-up's conversations must not share prefixes with the measured ones.
        shift = int(plan.conversation.max(initial=-1)) + 1
        convs = np.concatenate([np.where(warmup.conversation >= 0, warmup.conversation + shift, -1),
                                plan.conversation])
    started = time.perf_counter()
    outcome = cluster.run(at, prompts, outputs_all, convs)
    wall = time.perf_counter() - started
    reqs = outcome.requests[skip:]
    for r in reqs:  # measured from the start of the measured run
        r.sent -= offset
        r.first = None if r.first is None else r.first - offset
        r.done = None if r.done is None else r.done - offset
    utilisation = float(np.mean(outcome.prefill_busy)) / outcome.duration if outcome.duration else 0.0
    outcome.timeline = [dataclasses.replace(s, t=s.t - offset) for s in outcome.timeline if s.t >= offset]
    outcome.duration -= offset
    nan = float("nan")
    first = np.array([r.first if r.first is not None else nan for r in reqs])
    done = np.array([r.done if r.done is not None else nan for r in reqs])
    sent = plan.at.astype(float)
    outputs = plan.output_tokens.astype(np.int64)
    # What the engines gave (as `laps bench run` counts what arrives): fewer than asked where
    # prompt + output would pass the context.
    tokens = np.array([r.tokens for r in reqs], dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(tokens > 1, (done - first) / (tokens - 1), nan)
    status = np.array([r.status for r in reqs], dtype=np.int64)
    names = np.array([w.name for w in plan.phases], dtype=object)
    table = RequestTable.from_columns(
        index=np.arange(len(plan)), phase=names[plan.phase] if len(plan) else np.array([], dtype=object),
        cls=np.where(is_short(plan.prompt_tokens, threshold), SHORT, LONG).astype(object),
        prompt_tokens=plan.prompt_tokens, output_tokens=outputs, sent_s=sent, status=status,
        error=np.array([r.error for r in reqs], dtype=object), ttft_s=first - sent, e2e_s=done - sent,
        tokens=tokens, itl_mean_s=itl,
        turn=np.where(plan.conversation >= 0, plan.turn, -1), cached_tokens=np.array([r.cached for r in reqs]))
    meta = {"label": label or sys_config.name, "tool": "laps sim", "target": "sim", "system": sys_config.name,
            "profile": profile.name, "profile_provenance": profile.provenance,
            "cluster": {"prefill": prefill, "decode": decode}, "threshold": threshold,
            "allocation": {"rule": sys_config.allocation if moves_pods(sys_config.allocation, not sys_config.groups,
                                                                     prefill) else "none",
                           "interval_s": cluster.interval_s, **dataclasses.asdict(cluster.allocation)},
            "workload": {"name": plan.spec.name, "spec": plan.spec.model_dump(mode="json")},
            "seed": plan.spec.seed, "rate_scale": plan.rate_scale, "phases": [w.to_dict() for w in plan.phases],
            "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "duration_s": outcome.duration, "sim_wall_s": wall,
            "prefill_utilisation": utilisation, "prefix": _prefix_meta(plan, cluster, outcome), "moves": [
                {"t": t - offset, "pod": m.pod, "from": m.source, "to": m.target} for t, m in cluster.moves]}
    return RunResult(meta, table, outcome.timeline)


def _prefix_meta(plan: Plan, cluster: SimCluster, outcome) -> dict:
    """What the multi-turn report needs beyond the records (results/turns.py)."""
    block = cluster.prefixes.block_tokens
    oracle = oracle_cached_tokens(plan.prompt_tokens, plan.history_tokens, block)
    total = int(plan.prompt_tokens.sum())
    # Time in prefill batches of requests, as `laps bench` reads it from the engines
    # (laps_engine_prefill_latency_seconds): warms run only when a pod has nothing else to do.
    busy = {ep.name: b - w for ep, b, w in zip(cluster.prefill_eps, outcome.prefill_busy, outcome.prefill_warm)}
    groups = {g: [ep.name for ep in eps] for g, eps in cluster.groups.items() if eps}
    compute = sum(outcome.prefill_busy)
    return {"block_tokens": block, "oracle_hit_rate": float(oracle.sum() / total) if total else None,
            "warm_share": sum(outcome.prefill_warm) / compute if compute else 0.0,
            "pod_load": pod_load(busy, groups), "affinity": cluster.system.affinity}


def default_chars_per_token() -> float:
    return PromptBuilder(load_tokenizer(default_model_path()), 0).chars_per_token


def measure_capacity(spec: WorkloadSpec, profile: Profile, *, prefill: int, decode: int, threshold: int,
                     engine_args: tuple[str, ...] = ()) -> float:
    """Requests/s the baseline (`vanilla-pd`) sustains on this workload's length mix: the
    simulated throughput when a large batch of its requests all arrive at once (without the
    gateway's admission control, which would refuse most of such a burst at once: capacity is
    what the engines serve, not what the gateway turns away)."""
    n = max(2000, _CAPACITY_REQUESTS_PER_POD * prefill)
    base = len(plan_requests(spec))
    plan = plan_requests(spec, rate_scale=max(1.0, n / max(base, 1)), max_requests=n)
    zeros = np.zeros(len(plan))
    cluster = SimCluster(profile, SYSTEMS["vanilla-pd"], prefill=prefill, decode=decode, threshold=threshold,
                         engine_args=engine_args, sample_every_s=0, max_pending_tokens_per_pod=0)
    outcome = cluster.run(zeros, plan.prompt_tokens, plan.output_tokens)
    return len(plan) / outcome.duration if outcome.duration > 0 else float("inf")


def mean_rate(spec: WorkloadSpec) -> float:
    plan = require_requests(plan_requests(spec))  # --load scales this rate: 0 cannot be scaled
    return len(plan) / plan.duration_s if plan.duration_s > 0 else float("inf")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laps sim", description=__doc__.split("\n")[0],
                                epilog="Other flags are passed to every engine model (as the emulated engine takes them: --context-length, --kv-pages, ...).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--workload", help="workload YAML file or built-in name")
    what.add_argument("--matrix", help="a matrix YAML file or built-in name (family, small): its systems over "
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
                          interval_s=args.allocation_interval)
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
    # lazy: lab.sim.matrix imports this module (simulate, measure_capacity); only --matrix needs it
    from laps_agent.lab.sim.matrix import MatrixRun, run_matrix

    given = [flag for flag in _CELL_FLAGS if _given(flag, argv)]
    if given:
        print(f"laps sim: error: {', '.join(given)} cannot go with --matrix: the matrix sets "
              f"{'it' if len(given) == 1 else 'them'} per cell (profiles, shapes, loads)", file=sys.stderr)
        return 2
    try:
        matrix = load_matrix(args.matrix)
        if args.seed is not None:
            matrix = dataclasses.replace(matrix, spec=matrix.spec.model_copy(update={"seed": args.seed}))
        chosen = args.systems if _given("--systems", argv) else matrix.systems
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
        done = state.report.get("cells", [])
        if done:
            state.report["summary"] = summarize_matrix(done, chosen)
            save_report(state.report, out, plots=False)
        print(f"laps sim: interrupted after {len(done)} cell(s)" + (f"; theirs are saved in {out}" if done else ""),
              file=sys.stderr)
        return 130
    except WorkloadError as exc:
        print(f"laps sim: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"laps sim: error: cannot write the results: {exc}", file=sys.stderr)
        return 1
    return 0


def _given(flag: str, argv: list[str]) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def print_turns(turns: list) -> None:
    """Multi-turn table and issue 12's targets (results.turns.turns_report)."""
    print("\n" + turns_report(turns))
