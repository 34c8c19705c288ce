"""Allocation policy: which prefill pod, if any, moves between the short and long groups.

Pure (no I/O, no clock of its own): the operator's timer calls `decide` once per interval with
the groups' pressure and gets at most one move back; `laps local`'s gateway and `laps sim` drive
it through one `AllocationDriver` (the rates over each interval, the policy's memory between
decisions), each on its own clock.

The pressure P_g of group g is its class's *offered prefill work*: the seconds of a prefill pod's
time that the requests arriving for that class need per second, each request's prefill predicted
at the pods' measured cost (`offered_seconds`; the gateways count it in
`laps_gateway_offered_prefill_seconds_total{class}`), over the interval. With n_g its pods and
p_g = P_g / n_g (the share of each pod's time the class would take):
1. Unknown pressure (no data, stale data, the source is down): no move, say why.
2. Trigger: the more pressured group B has p_B >= ratio * p_A and p_B >= min_pressure.
3. Bounds: A keeps >= min_per_group pods after the move.
4. Benefit: max(P_A / (n_A - 1), P_B / (n_B + 1)) <= (1 - min_improvement) * p_B.
5. Hysteresis: the same move wanted in `confirm` consecutive intervals; a move opposite to the
   previous one must clear ratio^2 instead of ratio.
6. Cooldown: a pod that moved within `pod_cooldown_s` stays; at most one move per interval.
7. Which pod: A's pod out of cooldown with the least in-flight work of A's class; ties: the
   highest name.
Why each rule (idle noise, ping-pong, the pod's leftover work, scale-downs), why offered work and
not the work waiting, and not the reference's rule: docs/design/allocation.md.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from laps_agent.policy.classes import CLASSES, LONG, OTHER, SHORT
from laps_agent.policy.placement import PrefillCost

# The rules that move pods: this policy (`decide`) or the reference router's (`reference_decide`).
MODES = ("laps", "reference")


def fleet_cost(costs: Iterable[PrefillCost | None]) -> PrefillCost | None:
    """The prefill pods' measured cost as one figure (their mean), to predict the work of a
    request that is not yet at a pod; None while no pod has reported one."""
    known = [c for c in costs if c is not None]
    if not known:
        return None
    return PrefillCost(sum(c.overhead_s for c in known) / len(known), sum(c.per_token_s for c in known) / len(known))


# Where no prefill pod reports its cost (stock SGLang's /v1/loads has none): an H200's on a 32B
# model (the gpu-h200-qwen2.5-32b profile). The classes' shares of the work, which decide the
# moves, depend only on its overhead-to-per-token ratio; `min_pressure` is then approximate.
STAND_IN_COST = PrefillCost(0.017, 1e-4)


def offered_seconds(tokens: int, cost: PrefillCost | None) -> float:
    """The prefill seconds one arriving request of `tokens` prompt tokens offers its class, at
    `cost` (None: STAND_IN_COST). The one definition the gateway and `laps sim` count, and so
    the operator's query reads."""
    return (cost or STAND_IN_COST).seconds(tokens)


# One decision per interval, on the pressure over it (the operator, `laps local`, `laps sim`).
DEFAULT_INTERVAL_S = 5.0


@dataclass(frozen=True)
class AllocationConfig:
    ratio: float = 2.0              # the reference's trigger ratio, applied per pod
    min_per_group: int = 1
    # Per-pod pressure (a share of each pod's time) below which no group is pressed: a trickle of
    # one class on an idle cluster must not move pods to it one after another, leaving the other
    # class one pod when it comes back.
    min_pressure: float = 0.02
    min_improvement: float = 0.1    # the move must cut the worse per-pod pressure by this share
    confirm: int = 2                # consecutive intervals the same move must be wanted
    pod_cooldown_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.ratio >= 1:
            raise ValueError(f"ratio must be >= 1, got {self.ratio}")
        if self.min_per_group < 1:
            raise ValueError(f"min_per_group must be >= 1, got {self.min_per_group}")
        if not 0 <= self.min_improvement < 1:
            raise ValueError(f"min_improvement must be in [0, 1), got {self.min_improvement}")
        if self.confirm < 1:
            raise ValueError(f"confirm must be >= 1, got {self.confirm}")
        if not (self.min_pressure >= 0 and self.pod_cooldown_s >= 0):
            raise ValueError("min_pressure and pod_cooldown_s must be >= 0")


@dataclass(frozen=True)
class Move:
    pod: str
    source: str                      # group it leaves
    target: str                      # group it joins

    @property
    def direction(self) -> str:
        return f"{self.source}_to_{self.target}"


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between intervals (the caller stores it; the operator keeps
    it in the LAPSCluster's status, so a restarted operator goes on where it was)."""
    wanted: str | None = None        # direction wanted in the last interval(s)
    streak: int = 0                  # for how many consecutive intervals
    moved_at: Mapping[str, float] = field(default_factory=dict)   # pod -> time of its last move
    last_direction: str | None = None  # of the latest move (rule 5: reversing it costs more)

    def forget_pods(self, keep: set[str]) -> PolicyState:
        return replace(self, moved_at={p: t for p, t in self.moved_at.items() if p in keep})


@dataclass(frozen=True)
class Decision:
    move: Move | None
    reason: str
    state: PolicyState
    per_pod: Mapping[str, float] | None = None    # p_g, when pressure was known


def decide(members: Mapping[str, Sequence[str]], pressure: Mapping[str, float] | None,
           in_flight: Mapping[str, float], state: PolicyState, now: float,
           config: AllocationConfig) -> Decision:
    """members: group -> pod names; pressure: group -> P_g (None: unknown); in_flight: pod ->
    work of its current class it still holds (missing: 0)."""
    state = state.forget_pods({p for g in CLASSES for p in members.get(g, ())})
    if pressure is None or any(g not in pressure for g in CLASSES):
        return Decision(None, "pressure unknown", replace(state, wanted=None, streak=0))
    n = {g: len(members.get(g, ())) for g in CLASSES}
    if min(n.values()) == 0:
        return Decision(None, "a group has no pod that serves", replace(state, wanted=None, streak=0))
    per_pod = {g: max(float(pressure[g]), 0.0) / n[g] for g in CLASSES}
    worse = max(CLASSES, key=lambda g: (per_pod[g], g == LONG))
    source = OTHER[worse]
    direction = f"{source}_to_{worse}"
    idle = replace(state, wanted=None, streak=0)
    if per_pod[worse] < config.min_pressure:
        return Decision(None, "no group is under pressure", idle, per_pod)
    reverse = state.last_direction is not None and direction != state.last_direction
    ratio = config.ratio ** 2 if reverse else config.ratio
    if per_pod[worse] < ratio * per_pod[source]:
        return Decision(None, f"balanced within ratio {ratio:g}" + (" (a reversal)" if reverse else ""),
                        idle, per_pod)
    if n[source] - 1 < config.min_per_group:
        return Decision(None, f"{source} is at its minimum of {config.min_per_group} pods", idle, per_pod)
    after = max(pressure[source] / (n[source] - 1), pressure[worse] / (n[worse] + 1))
    if after > (1 - config.min_improvement) * per_pod[worse]:
        return Decision(None, "a move would not lower the worse group's per-pod pressure enough",
                        idle, per_pod)
    streak = state.streak + 1 if state.wanted == direction else 1
    wanting = replace(state, wanted=direction, streak=streak)
    if streak < config.confirm:
        return Decision(None, f"{direction} wanted ({streak}/{config.confirm})", wanting, per_pod)
    candidates = [p for p in members[source] if now - state.moved_at.get(p, -float("inf")) >= config.pod_cooldown_s]
    if not candidates:
        return Decision(None, f"every {source} pod moved within {config.pod_cooldown_s:g}s", wanting, per_pod)
    pod = min(candidates, key=lambda p: (in_flight.get(p, 0.0), highest_first(p)))
    moved = PolicyState(None, 0, {**state.moved_at, pod: now}, direction)
    return Decision(Move(pod, source, worse), f"{source} per pod {per_pod[source]:.2f}, {worse} per pod "
                    f"{per_pod[worse]:.2f}: moving one pod lowers the worse to {after:.2f}", moved, per_pod)


def highest_first(name: str) -> tuple:
    """Sort key putting the highest name first (ordinals compared as numbers): the tie-break of
    which pod goes, here and when a pool shrinks (planner.drain_order)."""
    head, _, tail = name.rpartition("-")
    return (0, -int(tail), head) if tail.isdigit() else (1, tuple(-ord(c) for c in name), "")


def reference_decide(members: Mapping[str, Sequence[str]], pending_requests: Mapping[str, float] | None,
                     ratio: float = 2.0) -> Move | None:
    """The reference system's rule (Jianshu-She/LAPS MiniLB `_laps_maybe_rebalance`), for
    comparisons: group TOTALS of pending requests; if short > long * ratio and long has more
    than one instance, move one long -> short, and vice versa; the last instance of a group
    moves (its last in the list)."""
    if pending_requests is None:
        return None
    short, long_ = pending_requests.get(SHORT, 0), pending_requests.get(LONG, 0)
    if short > long_ * ratio and len(members.get(LONG, ())) > 1:
        return Move(members[LONG][-1], LONG, SHORT)
    if long_ > short * ratio and len(members.get(SHORT, ())) > 1:
        return Move(members[SHORT][-1], SHORT, LONG)
    return None


class PressureWindow:
    """Averages samples between two decisions (the reference rule's pending request counts): a
    decision on one instant's pending work would follow every burst."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._count = 0

    def add(self, sample: Mapping[str, float]) -> None:
        for group in CLASSES:
            self._sums[group] = self._sums.get(group, 0.0) + float(sample.get(group, 0.0))
        self._count += 1

    def take(self) -> dict[str, float] | None:
        """The mean since the last take (None without samples), and start over."""
        if not self._count:
            return None
        mean = {g: s / self._count for g, s in self._sums.items()}
        self._sums, self._count = {}, 0
        return mean


class OfferedRate:
    """The classes' offered work per second from their cumulative counts: the growth since the
    last reading over the time since (a count that went back, a restarted counter, grows by 0)."""

    def __init__(self) -> None:
        self._last: tuple[float, dict[str, float]] | None = None

    @property
    def started(self) -> bool:
        """Whether it holds a reading the next rate starts from."""
        return self._last is not None

    def take(self, now: float, offered: Mapping[str, float]) -> dict[str, float] | None:
        """The rate since the last reading (None for the first, or no time since); this one is
        the next one's start."""
        last, self._last = self._last, (now, {g: float(offered.get(g, 0.0)) for g in CLASSES})
        if last is None or now <= last[0]:
            return None
        return {g: max(0.0, self._last[1][g] - last[1][g]) / (now - last[0]) for g in CLASSES}


class AllocationDriver:
    """One allocation loop, clock-agnostic: `begin` with the classes' offered work so far, then
    `step` once per interval with it again for at most one move (mode "laps": `decide` on the
    offered work per second over the interval); mode "reference" applies the reference
    router's rule (`reference_decide`) to the groups' pending request counts, `sample`d every
    second and averaged. The caller keeps the clock and applies the move: `laps local`'s gateway
    on the wall clock (gateway/allocator.py), `laps sim` on its virtual one
    (lab/sim/allocation.py), so both run exactly this loop."""

    def __init__(self, mode: str = "laps", config: AllocationConfig | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"allocation mode must be one of {MODES}, got {mode!r}")
        self.mode, self.config = mode, config or AllocationConfig()
        self.state = PolicyState()
        self.window = PressureWindow()
        self.rate = OfferedRate()
        self.last: dict = {"reason": "not decided yet"}   # the latest decision: reason, pressure, per pod

    def begin(self, now: float, offered: Mapping[str, float]) -> None:
        """Where the first interval's offered work is counted from."""
        self.rate.take(now, offered)

    def sample(self, pending: Callable[[str], tuple[float, float]]) -> None:
        """One sample of `pending(group)`, the group's (pending requests, pending tokens) as the
        gateway counts them, into the window the next step of the reference rule averages."""
        if self.mode == "reference":
            self.window.add({g: float(pending(g)[0]) for g in CLASSES})

    def step(self, now: float, members: Mapping[str, Sequence[str]], in_flight: Callable[[], Mapping[str, float]],
             offered: Mapping[str, float]) -> Move | None:
        """The move of this interval, if any. `members`: group -> pod names; `in_flight()`: pod ->
        work of its class it still holds (asked only by mode "laps"); `offered`: class -> its
        offered prefill seconds so far (as `offered_seconds` counts them); `now`: the caller's
        clock (the rate's interval, the pods' cooldowns)."""
        if self.mode == "reference":
            pressure = self.window.take()
            move = reference_decide(members, pressure, self.config.ratio)
            self.last = {"reason": "reference rule" if move else "reference rule: no move", "pressure": pressure}
            return move
        pressure = self.rate.take(now, offered)
        decision = decide(members, pressure, in_flight(), self.state, now, self.config)
        self.state = decision.state
        self.last = {"reason": decision.reason, "pressure": pressure, "per_pod": decision.per_pod}
        return decision.move
