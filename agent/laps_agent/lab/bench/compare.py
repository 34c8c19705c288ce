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
import asyncio
import datetime
import signal
import sys
from pathlib import Path

from laps_agent.emulated.profile import ProfileError, load_profile
from laps_agent.gateway.http.auth import keys_in
from laps_agent.lab.bench._runner import probe, run_workload
from laps_agent.lab.bench.run import RESULTS_DIR
from laps_agent.lab.results import compare_markdown, markdown, moves_by_phase, phases_markdown, save, summarize
from laps_agent.lab.results.turns import summarize_turns, turns_report
from laps_agent.lab.sim.run import mean_rate, measure_capacity
from laps_agent.lab.workload import Plan, WorkloadError, WorkloadSpec, load_workload, plan_requests
from laps_agent.lab.workload.plan import require_requests, warmup_plan
from laps_agent.local import stack as local
from laps_agent.local.process import LocalProcess
from laps_agent.local.signals_deferred import SignalsDeferred
from laps_agent.modelio.model_files import default_model_path
from laps_agent.modelio.tokenizer import load_tokenizer
from laps_agent.policy.systems import SIM_ONLY, SYSTEMS, SystemConfig, moves_pods, system, unused_allocation_flags
from laps_agent.serving.flag_types import names, non_negative, output_dir, positive, slo_seconds, unwritable_dir


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laps bench compare", description=__doc__.split("\n\n")[0],
                                epilog="Other flags are passed to every engine of every system.")
    p.add_argument("--workload", required=True, help="workload YAML file or built-in name")
    p.add_argument("--systems", type=names, default=["vanilla-pd", "reference", "laps"],
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


def local_args(args: argparse.Namespace, sys_config: SystemConfig, engine_args: list[str]) -> list[str]:
    out = ["--engine", args.engine, "--prefill", str(args.prefill), "--decode", str(args.decode),
           *sys_config.local_args(), *sys_config.engine_args()]
    if args.profile and args.engine == "emulated":
        out += ["--profile", args.profile]
    if args.model:
        out += ["--model", args.model]
    return out + engine_args


def local_problem(args: argparse.Namespace, sys_config: SystemConfig, engine_args: list[str]) -> str | None:
    """Why `laps local` would refuse this system's command line (local.args_problem: `--prefill 1`
    for a system that moves pods, a flag no engine takes, a bad value of one of `laps local`'s own
    flags passed through), found before the first system starts, not after the earlier ones ran."""

    parser = local.build_parser()
    parser.exit_on_error = False  # a bad value raises, rather than printing laps local's usage
    try:
        local_ns, rest = parser.parse_known_args(local_args(args, sys_config, engine_args))
    except argparse.ArgumentError as err:
        return str(err)
    return local.args_problem(local_ns, rest)


def idle_allocation_problem(args: argparse.Namespace, systems: list[SystemConfig],
                            engine_args: list[str]) -> str | None:
    """Allocation flags given when no system compared moves pods: silently ignored, they would
    read as part of a comparison they took no part in."""

    parser = local.build_parser()
    for sys_config in systems:
        ns = parser.parse_known_args(local_args(args, sys_config, engine_args))[0]
        if moves_pods(ns.allocation, ns.single_pool, ns.prefill):
            return None
    return unused_allocation_flags(parser.parse_known_args(engine_args)[0], [s.name for s in systems])


def api_key(engine_args: list[str]) -> str | None:
    """The key the load generator sends: the first in `--api-keys-file`, passed through to every
    system's gateway (local_problem has checked it holds one)."""

    keys_file = local.build_parser().parse_known_args(engine_args)[0].api_keys_file
    return keys_in(Path(keys_file))[0] if keys_file else None


async def _measure(url: str, spec: WorkloadSpec, plans: tuple[Plan, Plan | None], rate_scale: float, args,
                   tokenizer, label: str, key: str | None = None):
    """Warm-up and measured run of one system; None when Ctrl-C/SIGTERM came during the warm-up,
    a result with meta["interrupted"] when it came during the measured run (kept, as
    `laps bench run` keeps a partial run). `plans`: the measured run's and the warm-up's; `key`:
    the API key to send (api_key)."""

    plan, warm_plan = plans
    target = await probe(url, api_key=key)
    interrupted, warm_stop = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(*_) -> None:
        loop.call_soon_threadsafe(interrupted.set)
        loop.call_soon_threadsafe(warm_stop.set)

    # signal.signal, not the loop's add_signal_handler: the asyncio runner's own SIGINT handler
    # would win over the latter. Restored after, so a Ctrl-C between systems is a KeyboardInterrupt.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if warm_plan is not None:
            print(f"[compare] {label}: warm-up {args.warmup_s:g} s", flush=True)
            # Conversations' later turns come long after the warm-up phase ends: stop at its end
            # (what is in flight is cut; the warm-up's results are not kept).
            if spec.phases[0].conversation is not None:
                loop.call_later(args.warmup_s, warm_stop.set)
            await run_workload(url, warm_plan.spec, rate_scale=rate_scale, tokenizer=tokenizer,
                               timeout=args.timeout, label=f"{label}-warm-up", stop=warm_stop, plan=warm_plan,
                               target=target)
            if interrupted.is_set():
                return None
        print(f"[compare] {label}: measuring", flush=True)
        return await run_workload(url, spec, rate_scale=rate_scale, max_requests=args.max_requests,
                                  tokenizer=tokenizer, timeout=args.timeout, label=label, progress="lines",
                                  stop=interrupted, plan=plan, target=target)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    args, engine_args = build_parser().parse_known_args(argv)
    try:
        spec = load_workload(args.workload)
        if args.seed is not None:
            spec = spec.model_copy(update={"seed": args.seed})
        systems = [system(name) for name in args.systems]
    except (WorkloadError, ValueError) as exc:
        print(f"laps bench compare: error: {exc}", file=sys.stderr)
        return 2
    for sys_config in systems:
        if sys_config.name in SIM_ONLY:  # no gateway of `laps local` routes as it does
            print(f"laps bench compare: error: system {sys_config.name} exists only in the simulator "
                  f"(laps sim --systems {sys_config.name}): laps local cannot start it", file=sys.stderr)
            return 2
    for sys_config in systems:
        if problem := local_problem(args, sys_config, engine_args):
            print(f"laps bench compare: error: system {sys_config.name}: {problem}", file=sys.stderr)
            return 2
    if problem := idle_allocation_problem(args, systems, engine_args):
        print(f"laps bench compare: error: {problem}", file=sys.stderr)
        return 2
    out = args.out or RESULTS_DIR / (datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + "-compare")
    if problem := unwritable_dir(out):  # found now, not after every system has run
        print(f"laps bench compare: error: cannot write the results to {out}: {problem} (give --out DIR)",
              file=sys.stderr)
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
        local = None
        try:
            with SignalsDeferred():   # a laps local forked is one stopped below
                local = LocalProcess(local_args(args, sys_config, engine_args), out / sys_config.name / "local")
            print(f"[compare] {sys_config.name}: starting laps local", flush=True)
            local.wait_ready(args.startup_timeout)
            result = asyncio.run(_measure(local.url, spec, plans, rate_scale, args, tokenizer, sys_config.name,
                                          api_key(engine_args)))
        except RuntimeError as exc:
            print(f"laps bench compare: {sys_config.name}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # while it started: nothing measured on this system
            result = None
        finally:
            if local is not None:
                local.stop()
                local.kill()
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
