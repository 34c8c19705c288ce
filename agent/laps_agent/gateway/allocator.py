"""The allocation loop of a gateway with static membership (`laps local`): the policy's
AllocationDriver (laps_agent.policy.allocation) over the gateway's own counts, on the wall clock,
acting on the static membership.

Every interval the driver decides (mode "laps": the operator's policy over the classes' offered
prefill work per second, from the gateway's own count, `laps_gateway_offered_prefill_seconds`;
"reference": the reference router's rule over the groups' pending request counts, sampled every
second). A move changes the membership at once, so new requests of the pod's old
class go elsewhere from then on, while what it holds finishes there (its engine keeps scheduling
it); the engine's labels file is rewritten, so the engine reports its new group as a relabelled
pod would. `laps sim` runs the same driver on its virtual clock (lab/sim/allocation.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec, endpoint_name
from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.proxy.load import LoadTracker
from laps_agent.policy.allocation import DEFAULT_INTERVAL_S, AllocationConfig, AllocationDriver, Move
from laps_agent.policy.classes import CLASSES, LONG, SHORT

log = logging.getLogger(__name__)
_HISTORY = 20
_SAMPLE_S = 1.0


class StaticAllocator:
    def __init__(self, discovery: StaticDiscovery, tracker: LoadTracker, metrics: GatewayMetrics, *,
                 mode: str = "laps",
                 interval_s: float = DEFAULT_INTERVAL_S, config: AllocationConfig | None = None,
                 labels: dict[str, Path] | None = None,
                 write_labels: Callable[[Path, str], None] | None = None) -> None:
        self.driver = AllocationDriver(mode, config)   # ValueError for an unknown mode
        if not interval_s > 0:
            raise ValueError(f"the allocation interval must be > 0, got {interval_s}")
        self.discovery, self.tracker, self.metrics = discovery, tracker, metrics
        self.interval_s = interval_s
        self.labels, self.write_labels = labels or {}, write_labels
        self.moves: deque[dict] = deque(maxlen=_HISTORY)
        self._task: asyncio.Task | None = None

    @property
    def mode(self) -> str:
        return self.driver.mode

    @property
    def config(self) -> AllocationConfig:
        return self.driver.config

    @property
    def last(self) -> dict:
        return self.driver.last

    async def start(self) -> None:
        self.driver.begin(time.monotonic(), self.tracker.offered())
        self._task = asyncio.create_task(self._run(), name="allocation")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        next_decision = time.monotonic() + self.interval_s
        while True:
            await asyncio.sleep(_SAMPLE_S)
            self.driver.sample(self.tracker.group_pending)
            if time.monotonic() >= next_decision:
                next_decision += self.interval_s
                try:
                    await self.step(time.monotonic())
                except Exception:  # noqa: BLE001 - one bad step must not end the loop
                    log.exception("allocation step failed")

    def _members(self) -> dict[str, list[str]]:
        spec = self.discovery.spec
        return {SHORT: list(spec.prefill_short), LONG: list(spec.prefill_long)}

    def _in_flight(self, members: dict[str, list[str]]) -> dict[str, float]:
        """Pending prefill tokens per member URL (the tracker counts them per endpoint name)."""
        loads = self.tracker.loads()
        return {url: float(loads[name].pending_tokens) for g in CLASSES for url in members[g]
                if (name := endpoint_name(url)) in loads}

    async def step(self, now: float) -> Move | None:
        """One decision on the offered work since the last one; applies the move if any."""
        members = self._members()
        move = self.driver.step(now, members, lambda: self._in_flight(members), self.tracker.offered())
        if move is not None:
            await self._apply(move, members)
        return move

    async def _apply(self, move: Move, members: dict[str, list[str]]) -> None:
        members[move.source].remove(move.pod)
        members[move.target].append(move.pod)
        spec = self.discovery.spec
        await self.discovery.update(StaticSpec(tuple(members[SHORT]), tuple(members[LONG]), spec.decode))
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
