"""Pool sizing on the simulator's virtual clock: the planner (or a baseline) adds and removes pods.

Pods live as they do in Kubernetes: ordered -> serving once `startup_s` has passed (the model
loads) -> taken out of routing -> draining until they hold no request -> gone. Every pod that
exists holds its GPUs the whole time, which is what the GPU-seconds count. The prefill pool
is a StatefulSet (its scale-down removes the highest ordinals, so those are drained); decode
pods are drained least in-flight first (policy.planner.drain_order).

Three scalers, one observation loop:
- `planner`: laps_agent.policy.planner.plan on the arrivals of the last interval, as counted at
  the gateway (demand, refused requests too), the prefill engines' measured cost fit and the
  profile's decode cost;
- `utilisation`: the HPA-style baseline (policy.planner.utilisation_plan) on each pool's busy share;
- `static`: the counts never change (provisioned for the peak by the caller).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from laps_agent.emulated.core import EngineModel
from laps_agent.emulated.profile import Profile
from laps_agent.policy.classes import CLASSES
from laps_agent.policy.planner import (
    POOLS,
    ClassLoad,
    Observation,
    PlannerConfig,
    PlannerState,
    PodCosts,
    Pools,
    Slo,
    UtilisationState,
    drain_order,
    plan,
    utilisation_plan,
)

SCALERS = ("planner", "utilisation", "static")


@dataclass(frozen=True)
class Scaling:
    """How a simulated cluster is sized: which scaler, its limits and the SLOs it plans for."""
    scaler: str
    config: PlannerConfig
    slo: Slo

    def __post_init__(self) -> None:
        if self.scaler not in SCALERS:
            raise ValueError(f"scaler must be one of {', '.join(SCALERS)}, got {self.scaler!r}")


def pod_costs(prefill: EngineModel, profile: Profile) -> PodCosts | None:
    """What the planner predicts with: the prefill engine's own cost fit (what it reports) and
    the profile's decode and hand-off costs (the decode engine's step time)."""
    fit = prefill.scheduler.prefill_cost()
    if fit is None:
        return None
    d = profile.decode
    return PodCosts(prefill_overhead_s=fit[0], prefill_per_token_s=fit[1], decode_overhead_s=d.overhead_s,
                    decode_per_request_s=d.per_request_s, decode_per_context_token_s=d.per_context_token_s,
                    decode_max_running=profile.engine.max_running_requests,
                    decode_kv_tokens=profile.engine.kv_capacity_tokens,
                    transfer_per_token_s=profile.transfer_seconds(1_000_000) / 1_000_000)


@dataclass
class _Pod:
    pool: str
    name: str
    state: str = "off"          # off | starting | serving | draining
    ready_at: float = 0.0


@dataclass
class FleetEvent:
    t: float
    pool: str
    pod: str
    what: str                   # ordered | serving | draining | gone


class SimFleet:
    """Every pod of both pools and its state; GPU-seconds integrated over the run."""

    def __init__(self, names: dict[str, Sequence[str]], initial: Pools, config: PlannerConfig) -> None:
        self.config = config
        self.pods = {pool: [_Pod(pool, n) for n in names[pool]] for pool in POOLS}
        for pool in POOLS:
            for pod in self.pods[pool][:getattr(initial, pool)]:
                pod.state = "serving"
        self.desired = {pool: getattr(initial, pool) for pool in POOLS}
        self.gpu_seconds = 0.0
        self.max_gpus = self.gpus()
        self.events: list[FleetEvent] = []
        self.over_budget: list[tuple[float, int]] = []
        self._t = 0.0

    def gpus(self) -> int:
        per = {"prefill": self.config.gpus_per_prefill, "decode": self.config.gpus_per_decode}
        return sum(per[p] for p in POOLS for pod in self.pods[p] if pod.state != "off")

    def existing(self) -> Pools:
        return Pools(*(sum(pod.state != "off" for pod in self.pods[p]) for p in POOLS))

    def serving(self, pool: str) -> list[str]:
        return [pod.name for pod in self.pods[pool] if pod.state == "serving"]

    def advance(self, now: float) -> None:
        self.gpu_seconds += self.gpus() * max(0.0, now - self._t)
        self._t = max(self._t, now)

    def _changed(self, now: float) -> None:
        gpus = self.gpus()
        self.max_gpus = max(self.max_gpus, gpus)
        if self.config.gpu_budget is not None and gpus > self.config.gpu_budget:
            self.over_budget.append((now, gpus))

    def resize(self, pool: str, count: int, now: float, in_flight: Callable[[str], float]) -> list[str]:
        """Set `pool` to `count` pods: order the lowest free ordinals, or take pods out of
        routing (drain_order); returns the pods taken out (the caller stops routing to them)."""
        self.advance(now)
        self.desired[pool] = count
        live = [p for p in self.pods[pool] if p.state in ("starting", "serving")]
        out: list[str] = []
        if count > len(live):
            for pod in [p for p in self.pods[pool] if p.state == "off"][:count - len(live)]:
                pod.state, pod.ready_at = "starting", now + self.config.startup_s
                self.events.append(FleetEvent(now, pool, pod.name, "ordered"))
        elif count < len(live):
            # Pods still starting go first (nothing to drain), then serving ones in drain order.
            starting = [p for p in live if p.state == "starting"][::-1]
            serving = [p for p in live if p.state == "serving"]
            order = {n: i for i, n in enumerate(drain_order([p.name for p in serving],
                                                            {p.name: in_flight(p.name) for p in serving},
                                                            ordinals=pool == "prefill"))}
            for pod in (starting + sorted(serving, key=lambda p: order[p.name]))[:len(live) - count]:
                if pod.state == "starting":
                    pod.state = "off"
                    self.events.append(FleetEvent(now, pool, pod.name, "gone"))
                else:
                    pod.state = "draining"
                    out.append(pod.name)
                    self.events.append(FleetEvent(now, pool, pod.name, "draining"))
        self._changed(now)
        return out

    def tick(self, now: float, idle: Callable[[str, str], bool]) -> list[tuple[str, str]]:
        """Pods whose start-up ended now serve (returned, to be routed to); drained pods go."""
        self.advance(now)
        ready = []
        for pool in POOLS:
            for pod in self.pods[pool]:
                if pod.state == "starting" and pod.ready_at <= now:
                    pod.state = "serving"
                    ready.append((pool, pod.name))
                    self.events.append(FleetEvent(now, pool, pod.name, "serving"))
                elif pod.state == "draining" and idle(pool, pod.name):
                    pod.state = "off"
                    self.events.append(FleetEvent(now, pool, pod.name, "gone"))
        return ready


@dataclass
class _Window:
    count: dict[str, int] = field(default_factory=lambda: {c: 0 for c in CLASSES})
    uncached: dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CLASSES})
    prompt: dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CLASSES})
    output: dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CLASSES})


class SimScaler:
    """The scaler's loop: arrivals counted as the gateway counts them, one decision per interval."""

    def __init__(self, scaling: Scaling, fleet: SimFleet) -> None:
        self.scaling, self.fleet = scaling, fleet
        self.state = PlannerState()
        self.util_state = UtilisationState()
        self._window, self._since = _Window(), 0.0
        self._busy_at_start: dict[str, float] = {}
        self.decisions: list[dict] = []
        self.short_target: int | None = None

    def arrived(self, cls: str, uncached: int, prompt: int, output: int) -> None:
        w = self._window
        w.count[cls] += 1
        w.uncached[cls] += uncached
        w.prompt[cls] += prompt
        w.output[cls] += output

    def observation(self, now: float, decode_running: float, waiting: dict[str, float]) -> Observation:
        w, span = self._window, max(now - self._since, 1e-9)
        classes = {c: ClassLoad.counted(w.count[c], w.uncached[c], w.prompt[c], w.output[c], span, waiting.get(c, 0.0))
                   for c in CLASSES}
        self._window, self._since = _Window(), now
        return Observation(now, classes, decode_running, span)

    def decide(self, now: float, costs: PodCosts | None, decode_running: float, waiting: dict[str, float],
               busy: dict[str, float]) -> Pools | None:
        """The counts of this interval (None: the static scaler, nothing to change). `waiting`:
        class -> requests the gateway has sent to a prefill pod that has not prefilled them."""
        observation = self.observation(now, decode_running, waiting)
        desired = Pools(self.fleet.desired["prefill"], self.fleet.desired["decode"])
        if self.scaling.scaler == "static":
            return None
        if self.scaling.scaler == "utilisation":
            span = self.scaling.config.interval_s
            util = {p: (busy[p] - self._busy_at_start.get(p, 0.0)) / (span * max(1, len(self.fleet.serving(p))))
                    for p in POOLS}
            self._busy_at_start = dict(busy)
            pools, self.util_state, reason = utilisation_plan(util, desired, self.util_state, now,
                                                              self.scaling.config)
            self._log(now, pools, reason, False)
            return pools
        decision = plan(observation, costs, self.scaling.slo, desired, self.fleet.existing(), self.state, now,
                        self.scaling.config)
        self.state = decision.state
        if decision.short >= 0:
            self.short_target = decision.short
        self._log(now, Pools(decision.prefill, decision.decode), decision.reason, decision.frozen)
        return Pools(decision.prefill, decision.decode)

    @property
    def direction_changes(self) -> int:
        return self.util_state.changes if self.scaling.scaler == "utilisation" else self.state.changes

    def _log(self, now: float, pools: Pools, reason: str, frozen: bool) -> None:
        self.decisions.append({"t": now, "prefill": pools.prefill, "decode": pools.decode, "reason": reason,
                               "frozen": frozen})


def sizing_meta(fleet: SimFleet, scaler: SimScaler) -> dict:
    """What a sized run reports (its result's meta["sizing"]): GPU-seconds, the most GPUs held
    at once, steps over the budget (never, by the policy), direction changes, every decision
    and every pod's state changes."""
    return {"scaler": scaler.scaling.scaler, "gpu_seconds": fleet.gpu_seconds, "max_gpus": fleet.max_gpus,
            "over_budget": len(fleet.over_budget), "direction_changes": scaler.direction_changes,
            "end": [fleet.desired["prefill"], fleet.desired["decode"]],
            "decisions": scaler.decisions, "pods": [asdict(e) for e in fleet.events]}
