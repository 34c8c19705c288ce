"""The group allocation on the simulator's virtual clock: what `laps local`'s StaticAllocator does.

Separate from cluster.py because it is a loop of its own beside the requests' path, with its own
state (the policy's AllocationDriver: the pressure window and the policy's memory; the moves
made): the cluster feeds it a sample every second and lets it move a prefill pod between groups
every interval. The driver is `laps local`'s own (laps_agent.policy.allocation), only the clock
differs. `laps sim` takes `laps local`'s flags tuning the loop (`add_flags`), so a simulation can
try the values a real stack would run with.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence

from laps_agent.gateway.proxy.load import LoadTracker
from laps_agent.lab.results.records import TimelineSample
from laps_agent.policy.allocation import MODES, AllocationConfig, AllocationDriver, Move
from laps_agent.policy.classes import CLASSES
from laps_agent.policy.routing import Endpoint
from laps_agent.policy.systems import ALLOCATION_DEFAULTS, SystemConfig, moves_pods, unused_allocation_flags
from laps_agent.serving.flag_types import at_least, positive

Groups = dict[str, tuple[Endpoint, ...]]
INTERVAL_S = ALLOCATION_DEFAULTS["allocation_interval"]  # between decisions, as `laps local`


def runs_loop(system: SystemConfig) -> bool:
    """Whether a simulated cluster of `system` moves pods between groups."""
    return system.groups and system.allocation != "none"


def add_flags(p: argparse.ArgumentParser) -> None:
    """`laps local`'s allocation flags (names and meanings), on the virtual clock."""
    alloc = p.add_argument_group("allocation (moving prefill pods between the groups, as laps local)")
    alloc.add_argument("--allocation", choices=("laps", "reference", "none"), default=None,
                       help="override the systems' allocation (as `laps local --allocation`)")
    alloc.add_argument("--no-allocation", dest="allocation", action="store_const", const="none",
                       help="same as --allocation none")
    alloc.add_argument("--allocation-interval", type=positive(float), default=ALLOCATION_DEFAULTS["allocation_interval"],
                       help="simulated seconds between decisions")
    alloc.add_argument("--allocation-ratio", type=at_least(float, 1.0), default=ALLOCATION_DEFAULTS["allocation_ratio"],
                       help="per-pod pressure ratio that triggers a move")
    alloc.add_argument("--min-per-group", type=positive(int), default=ALLOCATION_DEFAULTS["min_per_group"])


def flags_problem(args: argparse.Namespace, systems: Sequence[SystemConfig]) -> str | None:
    """One line, or None: a --min-per-group the prefill pods cannot meet in both groups (the
    default 1 is no request: one prefill pod simply leaves the long group empty), or
    allocation flags where no system simulated moves pods (silently unused, they would read as
    part of a comparison they took no part in: `laps bench compare` refuses them alike)."""
    # laps local's rule (one prefill pod has none to move), as `laps bench compare` applies it.
    moving = [s.name for s in systems if moves_pods(s.allocation, not s.groups, args.prefill)]
    if moving and args.min_per_group > 1 and args.prefill < 2 * args.min_per_group:
        return (f"--min-per-group {args.min_per_group} needs at least {2 * args.min_per_group} prefill pods "
                f"({', '.join(moving)} {'moves' if len(moving) == 1 else 'move'} pods between two groups), "
                f"got --prefill {args.prefill}")
    if moving:
        return None
    # An --allocation of its own too: here it is sim's flag, not passed through as in compare.
    chosen = [f"--allocation {args.allocation}"] if args.allocation not in (None, "none") else []
    return unused_allocation_flags(args, [s.name for s in systems], also=chosen)


class SimAllocator:
    """The policy's AllocationDriver on the virtual clock, over the simulated gateway's tracker:
    the loop `laps local`'s StaticAllocator runs on the wall clock, here moving an endpoint
    between the simulated groups."""

    def __init__(self, rule: str, config: AllocationConfig, prefill_eps: Sequence[Endpoint]) -> None:
        # rule: the system's allocation ("laps", "reference" or "none")
        self._pods = {ep.name: ep for ep in prefill_eps}  # in pod order: the in-flight map keeps it
        self.moves: list[tuple[float, Move]] = []
        # None for a system that moves no pods (allocation "none"): samples go nowhere, and it
        # is never asked to rebalance (runs_loop).
        self._driver = AllocationDriver(rule, config) if rule in MODES else None
        if self._driver is not None:
            self._driver.begin(0.0, {})   # the simulated clock starts at 0, nothing offered yet

    def observe(self, tracker: LoadTracker) -> None:
        """One sample (every second) for the reference rule's window."""
        if self._driver is not None:
            self._driver.sample(tracker.group_pending)

    def rebalance(self, now: float, groups: Groups, tracker: LoadTracker) -> Groups:
        """The groups after this interval's decision (the same ones when nothing moves)."""
        members = {g: [ep.name for ep in eps] for g, eps in groups.items()}

        def in_flight() -> dict[str, float]:
            loads = tracker.loads()
            return {name: float(loads[name].pending_tokens) for name in self._pods if name in loads}

        move = self._driver.step(now, members, in_flight, tracker.offered())
        if move is None:
            return groups
        ep = self._pods[move.pod]
        self.moves.append((now, move))
        return {move.source: tuple(e for e in groups[move.source] if e is not ep),
                move.target: groups[move.target] + (ep,)}


def timeline_sample(now: float, groups: Groups, tracker: LoadTracker) -> TimelineSample:
    """Pods per group and their pending work, as the gateway counts them (the result's timeline)."""
    pending = {g: tracker.group_pending(g) for g in CLASSES}
    return TimelineSample(now, {g: len(eps) for g, eps in groups.items()},
                          {g: p[1] for g, p in pending.items()}, {g: p[0] for g, p in pending.items()})
