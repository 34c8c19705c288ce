"""One system of `laps bench compare`: its `laps local` command line (and why it would be
refused, found before any system starts), its warm-up and measured run over HTTP."""
from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from laps_agent.gateway.http.auth import keys_in
from laps_agent.lab.bench._runner import probe, run_workload
from laps_agent.lab.workload import Plan, WorkloadSpec
from laps_agent.local import stack as local
from laps_agent.local.process import LocalProcess
from laps_agent.local.signals_deferred import SignalsDeferred
from laps_agent.policy.systems import SIM_ONLY, SystemConfig, moves_pods, unused_allocation_flags
from laps_agent.serving.flag_types import slo_text, unwritable_dir


def systems_problem(args: argparse.Namespace, systems: list[SystemConfig], engine_args: list[str],
                    out: Path) -> str | None:
    """Why these systems cannot be compared with these flags, found before the first starts: a
    system only the simulator has, a `laps local` command line it would refuse, allocation flags
    no system uses, an output directory it cannot write."""
    for sys_config in systems:
        if sys_config.name in SIM_ONLY:  # no gateway of `laps local` routes as it does
            return (f"system {sys_config.name} exists only in the simulator (laps sim --systems "
                    f"{sys_config.name}): laps local cannot start it")
    for sys_config in systems:
        if problem := local_problem(args, sys_config, engine_args):
            return f"system {sys_config.name}: {problem}"
    if problem := idle_allocation_problem(args, systems, engine_args):
        return problem
    if problem := unwritable_dir(out):  # found now, not after every system has run
        return f"cannot write the results to {out}: {problem} (give --out DIR)"
    return None


def local_args(args: argparse.Namespace, sys_config: SystemConfig, engine_args: list[str]) -> list[str]:
    out = ["--engine", args.engine, "--prefill", str(args.prefill), "--decode", str(args.decode),
           *sys_config.local_args(), *sys_config.engine_args()]
    if args.profile and args.engine == "emulated":
        out += ["--profile", args.profile]
    if args.model:
        out += ["--model", args.model]
    if getattr(args, "slo", None):   # the gateway's, as the simulator's (lab/sim/cluster.py)
        out += ["--slo", slo_text(args.slo)]
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


async def measure(url: str, spec: WorkloadSpec, plans: tuple[Plan, Plan | None], rate_scale: float, args,
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


def run_system(args: argparse.Namespace, sys_config: SystemConfig, engine_args: list[str], out: Path,
               spec: WorkloadSpec, plans: tuple[Plan, Plan | None], rate_scale: float, tokenizer):
    """One system through `laps local` (started with `local_args`, logs in `out/local`), warmed up
    and measured (`measure`), then stopped: its result, or None when interrupted before it was
    measured. Raises RuntimeError when `laps local` does not come up."""
    local = None
    try:
        with SignalsDeferred():   # a laps local forked is one stopped below
            local = LocalProcess(local_args(args, sys_config, engine_args), out / "local")
        print(f"[compare] {sys_config.name}: starting laps local", flush=True)
        local.wait_ready(args.startup_timeout)
        return asyncio.run(measure(local.url, spec, plans, rate_scale, args, tokenizer, sys_config.name,
                                   api_key(engine_args)))
    except KeyboardInterrupt:  # while it started: nothing measured on this system
        return None
    finally:
        if local is not None:
            local.stop()
            local.kill()
