"""`laps local --autoscale`'s flags: limits the planner cannot hold are refused before anything
starts, with the reason (as `laps sim --autoscale` and the CRD refuse them)."""
from __future__ import annotations

from laps_agent.local.stack import args_problem, build_parser


def _problem(*argv: str) -> str | None:
    args, engine_args = build_parser().parse_known_args(list(argv))
    return args_problem(args, engine_args)


def test_a_budget_below_the_minimum_pools_is_refused_before_anything_starts():
    problem = _problem("--autoscale", "--device", "cuda", "--gpu-budget", "1")
    assert problem is not None and problem.startswith("--autoscale:") and "cannot hold the minimum pools" in problem
    assert _problem("--autoscale", "--prefill-min", "3", "--prefill-max", "2") == \
        "--autoscale: need 1 <= min <= max for both pools"
    # On the CPU the engines hold no GPU: any budget holds them.
    assert _problem("--autoscale", "--gpu-budget", "1") is None
