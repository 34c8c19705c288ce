"""`laps local --autoscale`: the planner (laps_agent.policy.planner.plan, as the operator and
`laps sim --autoscale` run it) on the wall clock, starting and stopping engine processes.

Every interval it reads what the gateway counted since the last decision (laps_gateway_arrivals
and their tokens, from its own registry), the work waiting at the prefill engines and the
requests held on the decode engines (its load tracker), and the prefill engines' cost as they
report it; then:
- up: new engines start (a prefill engine joins the group the planner's short need says,
  policy.planner.join_group) and the gateway routes to each once it answers, as it does at start;
- down: the engines with the least in-flight work leave the membership first (nothing new is
  sent to them), then, once the gateway holds nothing on them, get SIGTERM and finish what they
  hold (the engine's drain) before they exit. No request is lost to a scale-down.
/laps_status shows its decisions ("autoscaling"). A GPU budget counts one GPU an engine on
--device cuda (none on the CPU).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from laps_agent.gateway.discovery.membership import endpoint_name
from laps_agent.local.discovery import LocalDiscovery
from laps_agent.local.engines import EngineChild
from laps_agent.policy.allocation import fleet_cost
from laps_agent.policy.classes import CLASSES, LONG, SHORT
from laps_agent.policy.planner import (
    DEFAULT_DECODE_SLOTS,
    POOLS,
    ClassLoad,
    Observation,
    PlannerConfig,
    PlannerState,
    PodCosts,
    Pools,
    Slo,
    drain_order,
    join_group,
    plan,
)

log = logging.getLogger(__name__)
_HISTORY = 50
_DRAIN_POLL_S = 0.2


class LocalPlanner:
    def __init__(self, gateway, discovery: LocalDiscovery, spawn: Callable[[str, str | None], EngineChild],
                 stop: Callable[[EngineChild], None], children: list[EngineChild], config: PlannerConfig, slo: Slo,
                 say: Callable[[str], None]) -> None:
        self.gateway, self.discovery, self.spawn, self.stop_engine = gateway, discovery, spawn, stop
        self.children, self.config, self.slo, self.say = children, config, slo, say
        self.state = PlannerState()
        self.decisions: deque[dict] = deque(maxlen=_HISTORY)
        self.draining: dict[str, EngineChild] = {}
        self._counted = self._counters()
        self._counted_at = time.monotonic()
        self._task: asyncio.Task | None = None
        self._drains: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="planner")

    async def stop(self) -> None:
        for task in (self._task, *self._drains):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._task, *self._drains) if t is not None), return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self.step(time.time())
            except Exception:  # noqa: BLE001 - one bad step must not end the loop
                log.exception("planner step failed")

    # ---- what it observes --------------------------------------------------------------------
    def _counters(self) -> dict[tuple[str, str], float]:
        registry = self.gateway.metrics.registry
        out = {}
        for cls in CLASSES:
            out[cls, "requests"] = registry.get_sample_value("laps_gateway_arrivals_total", {"class": cls}) or 0.0
            for kind in ("prompt", "output"):
                out[cls, kind] = registry.get_sample_value("laps_gateway_arrival_tokens_total",
                                                           {"class": cls, "kind": kind}) or 0.0
        return out

    def observation(self, now: float) -> Observation:
        counted, at = self._counters(), time.monotonic()
        span = max(at - self._counted_at, 1e-9)
        delta = {k: counted[k] - self._counted.get(k, 0.0) for k in counted}
        self._counted, self._counted_at = counted, at
        tracker = self.gateway.tracker
        classes = {}
        for cls in CLASSES:
            classes[cls] = ClassLoad.counted(delta[cls, "requests"], delta[cls, "prompt"], delta[cls, "prompt"],
                                             delta[cls, "output"], span, float(tracker.group_pending(cls)[0]))
        return Observation(now, classes, float(sum(tracker.decode_held(c) for c in CLASSES)), span)

    def costs(self) -> PodCosts | None:
        loads = self.gateway.proxy.engine_loads
        spec = self.discovery.spec
        prefill = fleet_cost(loads.cost(endpoint_name(url)) for url in (*spec.prefill_short, *spec.prefill_long))
        if prefill is None:
            return None
        slots = [s for url in spec.decode if (s := loads.slots(endpoint_name(url)))]
        return PodCosts(prefill_overhead_s=prefill.overhead_s, prefill_per_token_s=prefill.per_token_s,
                        decode_overhead_s=0.0, decode_per_request_s=0.0, decode_per_context_token_s=0.0,
                        decode_max_running=min(slots) if slots else DEFAULT_DECODE_SLOTS, decode_kv_tokens=2**62)

    # ---- the decision and what it does ---------------------------------------------------------
    def _members(self, pool: str) -> list[str]:
        spec = self.discovery.spec
        return list(spec.prefill_short + spec.prefill_long) if pool == "prefill" else list(spec.decode)

    async def step(self, now: float) -> None:
        desired = Pools(len(self._members("prefill")), len(self._members("decode")))
        existing = Pools(*(len(self._members(p)) + sum(c.role == p for c in self.draining.values()) for p in POOLS))
        decision = plan(self.observation(now), self.costs(), self.slo, desired, existing, self.state, now,
                        self.config)
        self.state = decision.state
        # The decision is shown before its engines start, each named as its process starts: one
        # is routed (and counted in /laps_status) once it answers, which can be seconds before
        # the decision's last engine does.
        started, stopping = [], []
        self.decisions.append({"time": now, "prefill": decision.prefill, "decode": decision.decode,
                               "frozen": decision.frozen, "reason": decision.reason,
                               "started": started, "stopping": stopping})
        for pool in POOLS:
            change = getattr(decision, pool) - getattr(desired, pool)
            for _ in range(max(change, 0)):
                await self._start(pool, decision.short if decision.short >= 0 else None, started)
            if change < 0:
                stopping += await self._retire(pool, -change)
        if started or stopping:
            self.say(f"autoscale: {decision.reason}" + (f"; starting {', '.join(started)}" if started else "")
                     + (f"; draining {', '.join(stopping)}" if stopping else ""))

    async def _start(self, pool: str, short_target: int | None, started: list[str]) -> None:
        """One engine for `pool`, its name added to `started` (the decision's) once its process runs."""
        spec = self.discovery.spec
        group = join_group({SHORT: spec.prefill_short, LONG: spec.prefill_long}, short_target) \
            if pool == "prefill" else None
        child = await asyncio.to_thread(self.spawn, pool, group)
        self.children.append(child)
        started.append(child.name)
        await self.discovery.adopt(child)   # routed once it answers, as at start

    async def _retire(self, pool: str, count: int) -> list[str]:
        loads = self.gateway.tracker.loads()
        members = self._members(pool)
        in_flight = {url: float(load.pending_requests) if (load := loads.get(endpoint_name(url))) else 0.0
                     for url in members}
        by_url = {c.url: c for c in self.children}
        out = []
        for url in self._victims(pool, members, in_flight, count):
            child = by_url[url]
            await self.discovery.retire(url)   # nothing new is sent to it from now on
            self.draining[url] = child
            task = asyncio.create_task(self._drain(child), name=f"drain {child.name}")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
            out.append(child.name)
        return out

    def _victims(self, pool: str, members: list[str], in_flight: dict[str, float], count: int) -> list[str]:
        """The engines to take out: the least in-flight work first (drain_order); prefill ones
        from the larger group each time, so both groups keep a pod while there are two."""
        if pool != "prefill":
            return drain_order(members, in_flight, ordinals=False)[:count]
        spec = self.discovery.spec
        groups = {SHORT: list(spec.prefill_short), LONG: list(spec.prefill_long)}
        out = []
        for _ in range(count):
            larger = max(groups, key=lambda g: (len(groups[g]), g == LONG))
            if not groups[larger]:
                break
            url = drain_order(groups[larger], in_flight, ordinals=False)[0]
            groups[larger].remove(url)
            out.append(url)
        return out

    async def _drain(self, child: EngineChild) -> None:
        """Once the gateway holds nothing on it, SIGTERM: the engine finishes what it holds, exits."""
        name = endpoint_name(child.url)
        while (load := self.gateway.tracker.loads().get(name)) is not None and load.pending_requests > 0:
            await asyncio.sleep(_DRAIN_POLL_S)
        await asyncio.to_thread(self.stop_engine, child)
        self.draining.pop(child.url, None)
        self.say(f"autoscale: {child.name} drained and stopped")

    def status(self) -> dict:
        return {"enabled": True, "interval_s": self.config.interval_s,
                "limits": {"prefill": [self.config.min_prefill, self.config.max_prefill],
                           "decode": [self.config.min_decode, self.config.max_decode],
                           "gpu_budget": self.config.gpu_budget},
                "pods": {p: len(self._members(p)) for p in POOLS},
                "draining": sorted(c.name for c in self.draining.values()),
                "decisions": list(self.decisions)}

