"""The group allocation on the simulator's virtual clock: what `laps local`'s StaticAllocator does.

Separate from cluster.py because it is a loop of its own beside the requests' path, with its own
state (the pressure window, the policy's state, the moves made): the cluster feeds it a sample
every second and lets it move a prefill pod between groups every interval. The decisions are the
operator's own pure functions (laps_operator.allocation).
"""
from __future__ import annotations

from collections.abc import Sequence

from laps_agent.gateway.load import LoadTracker
from laps_agent.gateway.routing import Endpoint
from laps_agent.results.records import TimelineSample
from laps_operator.allocation import (AllocationConfig, Move, PolicyState, PressureWindow, decide,
                                      group_pressure, reference_decide)

Groups = dict[str, tuple[Endpoint, ...]]


class SimAllocator:
    def __init__(self, rule: str, config: AllocationConfig, prefill_eps: Sequence[Endpoint]) -> None:
        self.rule, self.config = rule, config           # rule: the system's allocation
        self._pods = {ep.name: ep for ep in prefill_eps}  # in pod order: the in-flight map keeps it
        self.moves: list[tuple[float, Move]] = []
        self._policy = PolicyState()
        self._window = PressureWindow()

    def observe(self, tracker: LoadTracker, groups: Groups) -> None:
        """One pressure sample (every second), into the window the next decision averages."""
        if self.rule == "reference":  # the reference counts pending requests
            sample = {g: float(tracker.group_pending(g)[0]) for g in groups}
        else:
            sample = {g: group_pressure(*tracker.group_pending(g)) for g in groups}
        self._window.add(sample)

    def rebalance(self, now: float, groups: Groups, tracker: LoadTracker) -> Groups:
        """The groups after this interval's decision (the same ones when nothing moves)."""
        members = {g: [ep.name for ep in eps] for g, eps in groups.items()}
        pressure = self._window.take()
        if self.rule == "reference":
            move = reference_decide(members, pressure, self.config.ratio)
        else:
            loads = tracker.loads()
            in_flight = {name: float(loads[name].pending_tokens) for name in self._pods if name in loads}
            decision = decide(members, pressure, in_flight, self._policy, now, self.config)
            self._policy, move = decision.state, decision.move
        if move is None:
            return groups
        ep = self._pods[move.pod]
        self.moves.append((now, move))
        return {move.source: tuple(e for e in groups[move.source] if e is not ep),
                move.target: groups[move.target] + (ep,)}


def timeline_sample(now: float, groups: Groups, tracker: LoadTracker) -> TimelineSample:
    """Pods per group and their pending work, as the gateway counts them (the result's timeline)."""
    pending = {g: tracker.group_pending(g) for g in ("short", "long")}
    return TimelineSample(now, {g: len(eps) for g, eps in groups.items()},
                          {g: p[1] for g, p in pending.items()}, {g: p[0] for g, p in pending.items()})
