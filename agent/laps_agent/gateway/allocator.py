"""The allocation loop of a gateway with static membership (`laps local`): the operator's policy
(laps_agent.policy.allocation) over the gateway's own pending work, acting on the static membership.

Every second the group pressure (`group_pressure` of the gateway's pending prefill requests and
tokens per group, as `laps_gateway_pending_requests|tokens` export them) is sampled; every interval the mean goes to the policy.
A move changes the membership at once, so new requests of the pod's old class go elsewhere from
then on, while what it holds finishes there (its engine keeps scheduling it); the engine's labels
file is rewritten, so the engine reports its new group as a relabelled pod would. Mode
"reference" applies the reference router's rule to the groups' pending request counts instead.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.proxy.load import LoadTracker
from laps_agent.policy.allocation import (
    GROUPS,
    AllocationConfig,
    Move,
    PolicyState,
    PressureWindow,
    decide,
    group_pressure,
    reference_decide,
)

log = logging.getLogger(__name__)
MODES = ("laps", "reference")
_HISTORY = 20
_SAMPLE_S = 1.0


class StaticAllocator:
    def __init__(self, discovery: StaticDiscovery, tracker: LoadTracker, metrics: GatewayMetrics, *,
                 mode: str = "laps",
                 interval_s: float = 5.0, config: AllocationConfig | None = None,
                 labels: dict[str, Path] | None = None,
                 write_labels: Callable[[Path, str], None] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"allocation mode must be one of {MODES}, got {mode!r}")
        if not interval_s > 0:
            raise ValueError(f"the allocation interval must be > 0, got {interval_s}")
        self.discovery, self.tracker, self.metrics, self.mode = discovery, tracker, metrics, mode
        self.interval_s, self.config = interval_s, config or AllocationConfig()
        self.labels, self.write_labels = labels or {}, write_labels
        self.state = PolicyState()
        self.window = PressureWindow()
        self.moves: deque[dict] = deque(maxlen=_HISTORY)
        self.last: dict = {"reason": "not decided yet"}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="allocation")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        next_decision = time.monotonic() + self.interval_s
        while True:
            await asyncio.sleep(_SAMPLE_S)
            self.window.add(self.sample())
            if time.monotonic() >= next_decision:
                next_decision += self.interval_s
                try:
                    await self.step(time.monotonic())
                except Exception:  # noqa: BLE001 - one bad step must not end the loop
                    log.exception("allocation step failed")

    def sample(self) -> dict[str, float]:
        if self.mode == "reference":  # the reference counts pending requests
            return {g: float(self.tracker.group_pending(g)[0]) for g in GROUPS}
        return {g: group_pressure(*self.tracker.group_pending(g)) for g in GROUPS}

    def _members(self) -> dict[str, list[str]]:
        spec = self.discovery.spec
        return {"short": list(spec.prefill_short), "long": list(spec.prefill_long)}

    async def step(self, now: float) -> Move | None:
        """One decision on the mean pressure since the last one; applies the move if any."""
        pressure = self.window.take()
        members = self._members()
        if self.mode == "reference":
            move = reference_decide(members, pressure, self.config.ratio)
            self.last = {"reason": "reference rule" if move else "reference rule: no move",
                         "pressure": pressure}
        else:
            loads = self.tracker.loads()
            in_flight = {url: float(loads[name].pending_tokens) for url in members["short"] + members["long"]
                         if (name := _name(url)) in loads}
            decision = decide(members, pressure, in_flight, self.state, now, self.config)
            self.state, move = decision.state, decision.move
            self.last = {"reason": decision.reason, "pressure": pressure, "per_pod": decision.per_pod}
        if move is not None:
            await self._apply(move, members)
        return move

    async def _apply(self, move: Move, members: dict[str, list[str]]) -> None:
        members[move.source].remove(move.pod)
        members[move.target].append(move.pod)
        spec = self.discovery.spec
        await self.discovery.update(StaticSpec(tuple(members["short"]), tuple(members["long"]), spec.decode))
        if self.write_labels is not None and move.pod in self.labels:
            self.write_labels(self.labels[move.pod], move.target)
        self.moves.append({"time": time.time(), "pod": move.pod, "from": move.source, "to": move.target,
                           "reason": self.last.get("reason"), "pressure": self.last.get("pressure")})
        self.metrics.rebalances.labels(move.direction).inc()
        log.info("moved %s from %s to %s (%s)", move.pod, move.source, move.target, self.last.get("reason"))

    def status(self) -> dict:
        return {"enabled": True, "mode": self.mode, "interval_s": self.interval_s,
                "ratio": self.config.ratio, "min_per_group": self.config.min_per_group,
                "last_decision": self.last, "moves": list(self.moves)}


def _name(url: str) -> str:
    """The endpoint name static discovery gives a URL (its host:port)."""
    return url.split("://", 1)[-1].rstrip("/")
