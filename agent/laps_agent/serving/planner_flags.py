"""The planner's flags, one definition for `laps sim --autoscale` and `laps local --autoscale`:
the same names and meanings as spec.autoscaling's fields (--prefill-min is autoscaling.prefill.min,
--scale-interval autoscaling.intervalSeconds, ...), the defaults policy.planner's."""
from __future__ import annotations

import argparse

from laps_agent.policy.planner import PlannerConfig, Slo
from laps_agent.policy.slo import DEFAULT_ITL_SLO_S, ttft_slos
from laps_agent.serving.flag_types import non_negative, positive


def add_planner_flags(g: argparse._ArgumentGroup | argparse.ArgumentParser, *, budget_help: str) -> None:
    g.add_argument("--itl-slo", type=positive(float), default=DEFAULT_ITL_SLO_S, help="ITL p90 SLO, seconds")
    g.add_argument("--gpu-budget", type=positive(int), default=None, help=budget_help)
    defaults = PlannerConfig()
    for pool in ("prefill", "decode"):
        g.add_argument(f"--{pool}-min", type=positive(int), default=getattr(defaults, f"min_{pool}"),
                       help=f"fewest {pool} pods")
        g.add_argument(f"--{pool}-max", type=positive(int), default=getattr(defaults, f"max_{pool}"),
                       help=f"most {pool} pods")
    g.add_argument("--scale-interval", type=positive(float), default=defaults.interval_s,
                   help="seconds between scaling decisions")
    g.add_argument("--startup", type=non_negative(float), default=None,
                   help=f"seconds from ordering a pod to its serving (model load); a rising load is planned "
                        f"this far ahead (default {defaults.startup_s:g}; laps local: what its engines took)")
    g.add_argument("--max-step", type=positive(int), default=defaults.max_step, help="pods per pool per decision")
    g.add_argument("--scale-down-stabilization", type=non_negative(float),
                   default=defaults.scale_down_stabilization_s,
                   help="seconds of needs a scale-down waits out (the highest of them is kept)")


def planner_slo(args: argparse.Namespace) -> Slo:
    """The SLOs the planner sizes for: --slo's TTFTs (a class without its own takes `all`, then
    the default) and --itl-slo."""
    return Slo(ttft_slos(args.slo), args.itl_slo)


def planner_config(args: argparse.Namespace, *, gpus_per_pod: int = 1, startup_s: float | None = None
                   ) -> PlannerConfig:
    """The planner's limits from the flags; ValueError naming what cannot hold."""
    startup = args.startup if args.startup is not None else startup_s
    return PlannerConfig(min_prefill=args.prefill_min, max_prefill=args.prefill_max, min_decode=args.decode_min,
                         max_decode=args.decode_max, gpu_budget=args.gpu_budget, gpus_per_prefill=gpus_per_pod,
                         gpus_per_decode=gpus_per_pod, interval_s=args.scale_interval, max_step=args.max_step,
                         scale_down_stabilization_s=args.scale_down_stabilization,
                         **({} if startup is None else {"startup_s": startup}))
