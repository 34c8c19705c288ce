"""`laps bench compare`: the same workload and seed against several serving systems, one after
another on this machine, each after a warm-up, with every figure as a ratio to the first.

Each system (laps_agent.systems: vanilla-pd, reference, laps) is started with `laps local`
(emulated engines with `--engine emulated --profile P`, or real CPU engines) and measured with
`laps bench run`'s load generator in-process. The warm-up replays the workload's first phase
with another seed for --warmup-s seconds (connections, caches, and the allocation loop settle),
then the measured run starts. --load F sets the mean rate to F times the capacity of vanilla-pd
on this workload's length mix, as `laps sim` measures it with the same profile (exact for
emulated engines; for real engines an estimate from the fitted profile, which is printed).

    laps bench compare --workload lmsys-steady --engine emulated --profile gpu-h200-qwen2.5-32b \\
        --prefill 8 --decode 2 --load 0.7 --slo short=0.3,long=1.5
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from pathlib import Path

from laps_agent.local_process import LocalProcess
from laps_agent.results import compare_markdown, markdown, moves_by_phase, phases_markdown, save, summarize
from laps_agent.results.turns import summarize_turns, turns_report
from laps_agent.systems import SYSTEMS, SystemConfig, system
from laps_agent.workload import WorkloadError, WorkloadSpec, load_workload
from laps_agent.workload.plan import warmup_spec


def _slo(text: str) -> dict[str, float]:
    from laps_agent.sim import _slo as parse

    return parse(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laps bench compare", description=__doc__.split("\n")[0],
                                epilog="Other flags are passed to every engine of every system.")
    p.add_argument("--workload", required=True, help="workload YAML file or built-in name")
    p.add_argument("--systems", default="vanilla-pd,reference,laps",
                   help=f"comma-separated; ratios are against the first ({', '.join(SYSTEMS)})")
    p.add_argument("--engine", choices=("emulated", "builtin"), default="emulated")
    p.add_argument("--profile", default=None, help="emulated engines' profile (default cpu-smollm2); "
                   "also the profile --load estimates capacity with")
    p.add_argument("--model", default=None, help="model (builtin) or tokenizer (emulated) path")
    p.add_argument("--prefill", type=int, default=8)
    p.add_argument("--decode", type=int, default=2)
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate-scale", type=float, default=None, help="multiply every phase's rate")
    load.add_argument("--load", type=float, default=None, help="mean rate as a fraction of vanilla-pd's capacity")
    p.add_argument("--seed", type=int, default=None, help="override the workload's seed")
    p.add_argument("--max-requests", type=int, default=None)
    p.add_argument("--warmup-s", type=float, default=30.0, help="warm-up seconds per system (0: none)")
    p.add_argument("--slo", type=_slo, default=None, help="per-class TTFT SLOs, e.g. short=0.3,long=2")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=None, help="default bench-results/<time>-compare")
    return p


def local_args(args: argparse.Namespace, sys_config: SystemConfig, engine_args: list[str]) -> list[str]:
    out = ["--engine", args.engine, "--prefill", str(args.prefill), "--decode", str(args.decode),
           *sys_config.local_args(), *sys_config.engine_args()]
    if args.profile and args.engine == "emulated":
        out += ["--profile", args.profile]
    if args.model:
        out += ["--model", args.model]
    return out + engine_args


async def _measure(url: str, spec: WorkloadSpec, rate_scale: float, args, tokenizer, label: str):
    from laps_agent.bench._runner import run_workload

    if args.warmup_s > 0:
        print(f"[compare] {label}: warm-up {args.warmup_s:g} s", flush=True)
        # Conversations' later turns come long after the warm-up phase ends: stop at its end
        # (what is in flight is cut; the warm-up's results are not kept).
        stop = asyncio.Event()
        if spec.phases[0].conversation is not None:
            asyncio.get_running_loop().call_later(args.warmup_s, stop.set)
        await run_workload(url, warmup_spec(spec, args.warmup_s), rate_scale=rate_scale,
                           tokenizer=tokenizer, timeout=args.timeout, label=f"{label}-warm-up", stop=stop)
    print(f"[compare] {label}: measuring", flush=True)
    return await run_workload(url, spec, rate_scale=rate_scale, max_requests=args.max_requests,
                              tokenizer=tokenizer, timeout=args.timeout, label=label, progress="lines")


def main(argv: list[str] | None = None) -> int:
    args, engine_args = build_parser().parse_known_args(argv)
    try:
        spec = load_workload(args.workload)
        if args.seed is not None:
            spec = spec.model_copy(update={"seed": args.seed})
        systems = [system(name.strip()) for name in args.systems.split(",") if name.strip()]
    except (WorkloadError, ValueError) as exc:
        print(f"laps bench compare: error: {exc}", file=sys.stderr)
        return 2
    from laps_agent.emulated.profile import load_profile
    from laps_agent.engine.model_files import default_model_path
    from laps_agent.tokenizer import load_tokenizer
    from laps_agent.sim import mean_rate, measure_capacity

    rate_scale = args.rate_scale or 1.0
    if args.load is not None:
        profile = load_profile(args.profile)
        capacity = measure_capacity(spec, profile, prefill=args.prefill, decode=args.decode,
                                    threshold=spec.threshold, engine_args=tuple(engine_args))
        rate_scale = args.load * capacity / mean_rate(spec)
        how = "exact for these engines" if args.engine == "emulated" else "an estimate for real engines"
        print(f"[compare] capacity of vanilla-pd on this mix (simulated with profile {profile.name}, {how}): "
              f"{capacity:.1f} req/s; running at {args.load:.0%} = {args.load * capacity:.1f} req/s "
              f"(rate x{rate_scale:.3f})", flush=True)
    tokenizer = load_tokenizer(args.model or default_model_path())
    out = args.out or Path("bench-results") / (datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + "-compare")
    labelled, turns = [], []
    for sys_config in systems:
        local = LocalProcess(local_args(args, sys_config, engine_args), out / sys_config.name / "local")
        try:
            print(f"[compare] {sys_config.name}: starting laps local", flush=True)
            local.wait_ready(args.startup_timeout)
            result = asyncio.run(_measure(local.url, spec, rate_scale, args, tokenizer, sys_config.name))
        except RuntimeError as exc:
            print(f"laps bench compare: {sys_config.name}: {exc}", file=sys.stderr)
            return 1
        finally:
            local.stop()
            local.kill()
        result.meta.update(slo=args.slo, system=sys_config.name, engine=args.engine, profile=args.profile,
                           cluster={"prefill": args.prefill, "decode": args.decode})
        save(result, out / sys_config.name, slo=args.slo)
        summary = summarize(result, slo=args.slo, by_phase=len(result.meta.get("phases") or []) > 1)
        labelled.append((sys_config.name, summary, moves_by_phase(result) if result.timeline else None))
        if "prefix" in result.meta:  # a workload with conversations (issue 12)
            turns.append((sys_config.name, summarize_turns(result)))
        print(f"\n## {sys_config.name}\n\n{markdown(summary)}\n", flush=True)
    table = compare_markdown([(label, summary) for label, summary, _ in labelled])
    per_phase = phases_markdown(labelled)
    if per_phase:
        table += "\n\n## per phase\n\n" + per_phase
    if turns:
        table += "\n\n" + turns_report(turns)
    (out / "compare.md").write_text(table + "\n")
    print(table)
    print(f"\nresults: {out}")
    return 0
