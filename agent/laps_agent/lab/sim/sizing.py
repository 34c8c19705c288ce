"""`laps sim --autoscale`: one system under several scalers, side by side, with the GPU-seconds.

    laps sim --workload diurnal --profile gpu-h200-qwen2.5-32b --systems laps \\
             --autoscale planner,utilisation,static --slo short=0.5,long=3 --itl-slo 0.05 --gpu-budget 16

Every scaler starts from --prefill/--decode, except `static`, provisioned for the peak: the
planner's need (policy.planner.need) at the busiest phase of the workload, computed before
the run from the planned arrivals, so it is the static cluster the planner's own model calls
enough. A request is attained when it was answered with its TTFT within its class's SLO and
its mean ITL within the ITL SLO; a refused request is a miss. Requests that arrive within
the scale-up lag (start-up + one interval) of a rate step of 2x or more in one phase change
are reported apart ("outside the lag" leaves them out): no scaler can have pods for them.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from laps_agent.emulated.profile import Profile
from laps_agent.lab.results import save
from laps_agent.lab.sim.autoscale import SCALERS, Scaling, pod_costs
from laps_agent.lab.sim.cluster import SimCluster
from laps_agent.lab.sim.run import simulate
from laps_agent.lab.workload.plan import Plan
from laps_agent.policy.classes import CLASSES, LONG, SHORT, is_short
from laps_agent.policy.planner import (
    ClassLoad,
    PlannerConfig,
    Slo,
    direction_changes_per_hour,
    need,
)
from laps_agent.policy.systems import SystemConfig
from laps_agent.serving.flag_types import names
from laps_agent.serving.planner_flags import add_planner_flags, planner_config, planner_slo

FLASH_STEP = 2.0                 # a phase change multiplying the rate by this much is a flash crowd


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sizing (laps sim --autoscale: the pools sized by a scaler; see lab/sim/sizing.py)")
    g.add_argument("--autoscale", type=names, default=None,
                   help=f"comma-separated scalers run side by side, the last the baseline of the GPU-seconds "
                        f"ratio ({', '.join(SCALERS)})")
    add_planner_flags(g, budget_help="GPUs of both pools together (one a pod)")


def phase_loads(plan: Plan, threshold: int) -> list[dict[str, ClassLoad]]:
    """Each phase's arrivals per class, as the planner observes them."""
    out = []
    for w in plan.phases:
        mask = plan.phase == w.index
        span = max(w.end_s - w.start_s, 1e-9)
        prompts, outputs = plan.prompt_tokens[mask], plan.output_tokens[mask]
        short = is_short(prompts, threshold)
        loads = {}
        for cls, sel in ((SHORT, short), (LONG, ~short)):
            prompt = float(prompts[sel].sum())
            loads[cls] = ClassLoad.counted(int(sel.sum()), prompt, prompt, float(outputs[sel].sum()), span)
        out.append(loads)
    return out


def peak_pools(plan: Plan, profile: Profile, system: SystemConfig, threshold: int, slo: Slo,
               config: PlannerConfig) -> tuple[int, int]:
    """Static provisioning for the peak: the planner's need at the phase that needs the most."""
    costs = pod_costs(SimCluster(profile, system, prefill=1, decode=1).prefill[0], profile)
    needs = [need(loads, costs, slo, config) for loads in phase_loads(plan, threshold)]
    gpus = [config.gpus(n.prefill, n.decode) for n in needs]
    top = needs[int(np.argmax(gpus))]
    prefill = min(max(top.prefill, config.min_prefill), config.max_prefill)
    decode = min(max(top.decode, config.min_decode), config.max_decode)
    if config.gpu_budget is not None:
        while config.gpus(prefill, decode) > config.gpu_budget and prefill + decode > 2:
            if prefill >= decode and prefill > config.min_prefill:
                prefill -= 1
            else:
                decode -= 1
    return prefill, decode


def lag_windows(plan: Plan, lag_s: float) -> list[tuple[float, float]]:
    """[start, start + lag) of every phase whose rate is FLASH_STEP x its predecessor's or more."""
    out = []
    for before, after in zip(plan.phases, plan.phases[1:]):
        if before.mean_rate > 0 and after.mean_rate >= FLASH_STEP * before.mean_rate:
            out.append((after.start_s, after.start_s + lag_s))
    # A ramp of several short phases is one crowd: from its first step on.
    merged: list[tuple[float, float]] = []
    for start, end in out:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def row(name: str, result, slo: Slo, itl_slo: float, lag: list[tuple[float, float]], outcome_meta: dict) -> dict:
    t = result.records.columns
    ok = t["status"] == 200
    ttft = t["ttft_s"]
    itl = t["itl_mean_s"]
    sent = t["sent_s"]
    in_lag = np.zeros(len(sent), dtype=bool)
    for start, end in lag:
        in_lag |= (sent >= start) & (sent < end)
    out = {"scaler": name}
    for cls in CLASSES:
        sel = t["cls"] == cls
        met = ok & (ttft <= slo.ttft_s[cls]) & ~(np.nan_to_num(itl, nan=0.0) > itl_slo)
        out[f"{cls}_attainment"] = float(met[sel].mean()) if sel.any() else None
        outside = sel & ~in_lag
        out[f"{cls}_attainment_outside_lag"] = float(met[outside].mean()) if outside.any() else None
        out[f"{cls}_refused"] = int((sel & (t["status"] == 429)).sum())
    out.update(outcome_meta)
    return out


def run_sizing(args: argparse.Namespace, engine_args: list[str], plan: Plan, profile: Profile,
               system: SystemConfig, threshold: int, out: Path) -> int:
    """Simulate `system` under each scaler of --autoscale; print the table, save the results."""
    slo = planner_slo(args)
    config = planner_config(args)
    peak = peak_pools(plan, profile, system, threshold, slo, config)
    lag_s = config.startup_s + config.interval_s
    lag = lag_windows(plan, lag_s)
    print(f"sizing {system.name} on {plan.spec.name}: SLO TTFT p90 short {slo.ttft_s[SHORT]:g}s, long "
          f"{slo.ttft_s[LONG]:g}s, ITL {slo.itl_s * 1000:g}ms; budget {config.gpu_budget or 'none'} GPUs; "
          f"start-up {config.startup_s:g}s, interval {config.interval_s:g}s (scale-up lag {lag_s:g}s); "
          f"static for the peak: {peak[0]} prefill + {peak[1]} decode", flush=True)
    rows = []
    for name in args.autoscale:
        start = peak if name == "static" else (args.prefill, args.decode)
        result = simulate(plan, profile, system, prefill=start[0], decode=start[1], threshold=threshold,
                          ttft_slo_s=slo.ttft_s,
                          engine_args=tuple(engine_args), scaling=Scaling(name, config, slo))
        sized = result.meta["sizing"]
        duration = max(result.meta["duration_s"], plan.duration_s)
        ordered = sorted(p["t"] for p in sized["pods"] if p["what"] == "ordered")
        first_steps = [next((t - start_s for t in ordered if t >= start_s), None) for start_s, _ in lag]
        meta = {key: sized[key] for key in ("gpu_seconds", "max_gpus", "over_budget", "direction_changes", "end")}
        meta.update(direction_changes_per_hour=direction_changes_per_hour(sized["direction_changes"], duration),
                    first_step_after_crowd_s=first_steps, start=list(start))
        rows.append(row(name, result, slo, args.itl_slo, lag, meta))
        save(result, out / name, slo=args.slo, plots=not args.no_plots)
    base = rows[-1]["gpu_seconds"]
    for r in rows:
        r["gpu_seconds_ratio"] = r["gpu_seconds"] / base if base else None
    print("\n" + sizing_markdown(rows, lag_s))
    (out / "sizing.json").write_text(json.dumps({"rows": rows, "lag_windows": lag, "peak": peak,
                                                 "slo": {"ttft_s": dict(slo.ttft_s), "itl_s": slo.itl_s},
                                                 "config": asdict(replace(config))}, indent=2))
    print(f"\nfiles: {out / 'sizing.json'}")
    return 0


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def sizing_markdown(rows: list[dict], lag_s: float) -> str:
    head = ("| scaler | short attained | long attained | short / long outside lag | refused s/l | GPU-s | "
            "ratio | max GPUs | over budget | direction changes (/h) | first step after a crowd | at the end |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        first = ", ".join("-" if s is None else f"{s:.0f}s" for s in r["first_step_after_crowd_s"]) or "-"
        lines.append(f"| {r['scaler']} | {_pct(r['short_attainment'])} | {_pct(r['long_attainment'])} | "
                     f"{_pct(r['short_attainment_outside_lag'])} / {_pct(r['long_attainment_outside_lag'])} | "
                     f"{r['short_refused']} / {r['long_refused']} | {r['gpu_seconds']:.0f} | "
                     f"{r['gpu_seconds_ratio']:.2f}x | {r['max_gpus']} | {r['over_budget']} | "
                     f"{r['direction_changes']} ({r['direction_changes_per_hour']:.1f}) | {first} | "
                     f"{r['end'][0]}P + {r['end'][1]}D |")
    return head + "\n".join(lines) + f"\n\n(lag: requests within {lag_s:g}s of a 2x rate step are left out)"
