"""Planner policy: how many prefill and decode pods meet the SLOs at least cost, within a GPU budget.

Pure (no I/O, no clock of its own): a driver calls `plan` once per interval with what it observed
(arrivals per class, output lengths, decode concurrency), the engines' measured costs and the
pool counts, and gets the counts to set back, with the reason. The operator, `laps local
--autoscale` and `laps sim --autoscale` drive this one function, each on its own clock.

Rules, in order:
1. Freeze: no observation, one older than `stale_after_s`, or no measured cost: the counts stay,
   and the reason says why (the operator writes it into a status condition).
2. Need, predicted in seconds (`need`): per class, the fewest prefill pods whose predicted p90
   TTFT (queueing wait + its own prefill + hand-off + one decode step) is within `headroom` x the
   class's SLO; the decode pods that hold the predicted concurrency in `headroom` x their slots
   at an ITL within `headroom` x the ITL SLO. Prefill = short + long (the split goes to the
   allocation loop), or fewer where the classes as one stream on shared pods meet both SLOs (a
   light load: one pod serves both); no traffic: 0.
   Work waiting now (a backlog the pods did not keep up with) is served within the next
   interval on top of the arrivals: it adds waiting / interval to the class's rate.
3. Lead: scaling up plans for the rate predicted `startup_s + interval_s` ahead (the trend of the
   observed total rate, the part of it beyond its sampling noise), since a pod ordered now serves
   only after it has loaded its model.
4. Hysteresis: up at once; down only to the highest need of the last `scale_down_stabilization_s`
   (a dip does not give pods back that the load will want again), each need taken at the rate's
   upper noise bound (`rate_bound`): a pod is given back only when the load is below its count by
   more than a count of arrivals varies by chance. A planner without history (just turned on, or
   restarted without its state) counts the set counts as needed at first.
5. Limits: each pool within [min, max] and at most `max_step` pods per interval each way.
6. Budget: the GPUs of the pods that exist (draining ones too, they still hold theirs) plus
   those ordered never exceed `gpu_budget`, on any step: when both pools want more than it has,
   it is shared in proportion to the needs; a pool grows only into room that is free now.
Why these rules and what they were measured against: docs/design/planner.md.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from laps_agent.policy.allocation import highest_first
from laps_agent.policy.classes import CLASSES, LONG, SHORT
from laps_agent.policy.groups import joining_group
from laps_agent.policy.slo import SLO_QUANTILE

POOLS = ("prefill", "decode")
# A decode pod's slots where its engines report none (the builtin engine's --max-running-requests).
DEFAULT_DECODE_SLOTS = 32
# Sampling noise, in standard deviations of a Poisson count of arrivals: a rate (or its trend)
# counts as moved only beyond this many (about one interval in 700 goes past it by chance; at 2,
# one in 40 did, and a constant load still changed direction up to 4 times an hour).
NOISE_Z = 3.0
# The newest slope's weight in the trend: about 1/w intervals' slopes averaged, so that a steady
# ramp stands out of the noise (at 0.5 the noise hid the diurnal day's rise, and pods came late).
TREND_WEIGHT = 0.2


@dataclass(frozen=True)
class ClassLoad:
    """One length class's arrivals over the last window, and what of it waits now."""
    rate: float                      # requests/s
    uncached_tokens: float = 0.0     # mean prompt tokens each needs prefilled
    prompt_tokens: float = 0.0       # mean whole prompt (its decode context)
    output_tokens: float = 0.0       # mean tokens each answer has
    waiting: float = 0.0             # requests waiting for their prefill now (the gateway's pending)

    @classmethod
    def counted(cls, requests: float, uncached_tokens: float, prompt_tokens: float, output_tokens: float,
                span_s: float, waiting: float = 0.0) -> ClassLoad:
        """From what arrived over `span_s` seconds (totals: requests and their tokens), as every
        driver counts it (sim, laps local, the operator's Prometheus rates over 1 s)."""
        if requests <= 0:
            return cls(0.0, waiting=waiting)
        return cls(requests / span_s, uncached_tokens / requests, prompt_tokens / requests, output_tokens / requests,
                   waiting)

    def demand(self, interval_s: float) -> float:
        """Requests/s to serve: the arrivals, and what waits now served within the next interval."""
        return self.rate + self.waiting / interval_s


@dataclass(frozen=True)
class Observation:
    at: float                                  # when it was measured, on the caller's clock
    classes: Mapping[str, ClassLoad]
    decode_running: float | None = None        # requests on the decode pool now (all pods)
    span_s: float | None = None                # the seconds the rates were counted over; None: one interval


@dataclass(frozen=True)
class PodCosts:
    """What one pod of each pool costs, as its engines measured (the sim: the profile's model)."""
    prefill_overhead_s: float                  # a prefill batch: overhead + per token x tokens
    prefill_per_token_s: float
    decode_overhead_s: float                   # a decode step: overhead + per request x batch
    decode_per_request_s: float                #   + per context token x tokens in the batch
    decode_per_context_token_s: float
    decode_max_running: int                    # requests one decode pod runs at once
    decode_kv_tokens: int                      # KV tokens one decode pod holds
    transfer_per_token_s: float = 0.0          # KV hand-off, per prompt token

    def prefill_seconds(self, tokens: float) -> float:
        return self.prefill_overhead_s + self.prefill_per_token_s * tokens

    def decode_step_seconds(self, batch: float, context_tokens: float) -> float:
        return (self.decode_overhead_s + self.decode_per_request_s * batch
                + self.decode_per_context_token_s * batch * context_tokens)


@dataclass(frozen=True)
class Slo:
    ttft_s: Mapping[str, float]                # class -> TTFT p90 target
    itl_s: float                               # ITL p90 target

    def __post_init__(self) -> None:
        if any(not self.ttft_s.get(c, 0) > 0 for c in CLASSES) or not self.itl_s > 0:
            raise ValueError("every SLO must be > 0 seconds (ttft short and long, itl)")


@dataclass(frozen=True)
class PlannerConfig:
    min_prefill: int = 1
    max_prefill: int = 16
    min_decode: int = 1
    max_decode: int = 16
    gpu_budget: int | None = None              # GPUs of both pools together; None: no budget
    gpus_per_prefill: int = 1
    gpus_per_decode: int = 1
    interval_s: float = 30.0
    max_step: int = 4                          # pods per pool per interval, each way
    scale_down_stabilization_s: float = 120.0
    startup_s: float = 120.0                   # from ordering a pod to its serving (model load)
    stale_after_s: float | None = None         # None: 3 intervals
    headroom: float = 0.7                      # the share of an SLO a prediction may use

    def __post_init__(self) -> None:
        if not (1 <= self.min_prefill <= self.max_prefill and 1 <= self.min_decode <= self.max_decode):
            raise ValueError("need 1 <= min <= max for both pools")
        if self.gpus_per_prefill < 0 or self.gpus_per_decode < 0:
            raise ValueError("GPUs per pod must be >= 0")
        if self.gpu_budget is not None and self.gpu_budget < self.gpus(self.min_prefill, self.min_decode):
            raise ValueError(f"gpu_budget {self.gpu_budget} cannot hold the minimum pools "
                             f"({self.gpus(self.min_prefill, self.min_decode)} GPUs)")
        if self.max_step < 1 or not self.interval_s > 0 or self.startup_s < 0:
            raise ValueError("max_step >= 1, interval_s > 0 and startup_s >= 0")
        if not 0 < self.headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], got {self.headroom}")

    def gpus(self, prefill: int, decode: int) -> int:
        return prefill * self.gpus_per_prefill + decode * self.gpus_per_decode

    @property
    def stale_s(self) -> float:
        return 3 * self.interval_s if self.stale_after_s is None else self.stale_after_s


@dataclass(frozen=True)
class Pools:
    """Pod counts: what is set (`desired`) and what exists (`existing`, draining pods too)."""
    prefill: int
    decode: int


@dataclass(frozen=True)
class Need:
    prefill: int
    decode: int
    short: int                                 # of the prefill pods, those the short class needs
    limit: str = ""                            # why a need is capped (an SLO no pod count meets)


@dataclass(frozen=True)
class PlannerState:
    """What the planner remembers (the operator keeps it in status): recent needs for the
    stabilisation window, the last rate for the trend, the direction of each pool's last change."""
    needs: tuple[tuple[float, int, int], ...] = ()     # (time, prefill need, decode need)
    last_rate: tuple[float, float] | None = None       # (time, total requests/s)
    trend: float = 0.0                                 # requests/s per second, smoothed
    directions: Mapping[str, int] = field(default_factory=dict)   # pool -> +1 | -1
    changes: int = 0                                   # direction changes so far


@dataclass(frozen=True)
class Plan:
    prefill: int
    decode: int
    short: int                  # the prefill pods the short class needs (allocation's target)
    reason: str
    frozen: bool
    state: PlannerState
    need: Need | None = None


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/n queue with `offered` = lambda x mean service."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):   # Erlang B by its recursion (stable for any n)
        b = offered * b / (k + offered * b)
    return servers * b / (servers - offered * (1 - b))


def wait_quantile(servers: int, rate: float, service_s: float, q: float = SLO_QUANTILE) -> float:
    """The q-quantile of the queueing wait on `servers` pods sharing one queue (the gateway sends
    each request where it would start first), M/M/n: P(W > t) = C e^{-(n mu - lambda) t}."""
    offered = rate * service_s
    if offered >= servers:
        return math.inf
    c = erlang_c(servers, offered)
    if c <= 1 - q:
        return 0.0
    return service_s / (servers - offered) * math.log(c / (1 - q))


def _prefill_pods(loads: Mapping[str, ClassLoad], slo: Slo, costs: PodCosts, decode_s: float,
                  config: PlannerConfig) -> tuple[int, str]:
    """The fewest pods serving `loads` as one stream (one class, or both on shared pods behind
    the mean request) within each class's SLO; 0 without demand. When a class's own prefill
    alone is over its SLO, the pods that keep up, and why."""
    rates = {c: x.demand(config.interval_s) for c, x in loads.items()}
    rate = sum(rates.values())
    if rate <= 0:
        return 0, ""
    service = {c: costs.prefill_seconds(max(x.uncached_tokens, 1.0)) for c, x in loads.items()}
    mean = sum(rates[c] * service[c] for c in loads) / rate
    fixed = {c: service[c] + costs.transfer_per_token_s * loads[c].prompt_tokens + decode_s for c in loads}
    over = [c for c in loads if fixed[c] > config.headroom * slo.ttft_s[c]]
    if over:
        return max(1, math.ceil(rate * mean / 0.9)), "; ".join(
            f"one request's own prefill takes {fixed[c]:.2f}s, over {config.headroom:g} x its {slo.ttft_s[c]:g}s SLO"
            for c in over)
    n = max(1, math.ceil(rate * mean))
    while n < config.max_prefill and any(fixed[c] + wait_quantile(n, rate, mean) > config.headroom * slo.ttft_s[c]
                                         for c in loads):
        n += 1
    return n, ""


def need(classes: Mapping[str, ClassLoad], costs: PodCosts, slo: Slo, config: PlannerConfig,
         decode_running: float | None = None) -> Need:
    """The pods each pool needs for these arrivals (rule 2), before limits and budget."""
    loads = {c: classes.get(c, ClassLoad(0.0)) for c in CLASSES}
    rate = sum(x.demand(config.interval_s) for x in loads.values())
    limits = []
    # Decode: the largest batch one pod runs within the ITL SLO, its KV and its slots.
    context = (sum(x.rate * (x.prompt_tokens + x.output_tokens / 2) for x in loads.values()) / rate
               if rate > 0 else 0.0)
    itl_target = config.headroom * slo.itl_s
    batch = costs.decode_max_running
    if context > 0:
        batch = min(batch, int(costs.decode_kv_tokens // max(context * 2, 1)))
    while batch > 1 and costs.decode_step_seconds(batch, context) > itl_target:
        batch -= 1
    step_s = costs.decode_step_seconds(max(batch, 1), context)
    if step_s > itl_target:
        limits.append(f"one decode step takes {step_s * 1000:.0f}ms, over {config.headroom:g} x the "
                      f"{slo.itl_s * 1000:g}ms ITL SLO")
    outputs = sum(x.rate * x.output_tokens for x in loads.values())
    concurrency = outputs * step_s              # Little: requests/s x seconds each decodes
    if decode_running is not None:
        concurrency = max(concurrency, decode_running)
    # The slots get the same headroom as the SLOs: a pod full to its last slot makes the next
    # arrival wait for a whole answer to end.
    decode = math.ceil(concurrency / (config.headroom * max(batch, 1)) - 1e-9) if rate > 0 else 0
    per_class = {}
    for c in CLASSES:
        per_class[c], why = _prefill_pods({c: loads[c]}, slo, costs, step_s, config)
        if why:
            limits.append(f"{c}: {why}")
    prefill = per_class[SHORT] + per_class[LONG]
    if per_class[SHORT] and per_class[LONG]:
        pooled, over = _prefill_pods(loads, slo, costs, step_s, config)
        if not over:   # shared pods only where they meet both SLOs
            prefill = min(prefill, pooled)
    return Need(prefill, decode, min(per_class[SHORT], prefill), "; ".join(limits))


def rate_bound(rate: float, span_s: float) -> float:
    """The rate's upper noise bound: `rate` counted over `span_s` seconds, plus NOISE_Z standard
    deviations of that count (Poisson: the square root of the count)."""
    return rate + NOISE_Z * math.sqrt(max(rate, 0.0) / span_s)


def trend_noise(rate: float, span_s: float) -> float:
    """NOISE_Z standard deviations of the smoothed trend at a steady `rate`: each slope is two
    rates' difference over one span, and their exponential mean (`_trend`, weight w) varies by
    w^2 x 2 / (2 - w) x the variance of one rate (rate / span), over span^2."""
    w = TREND_WEIGHT
    return NOISE_Z * w * math.sqrt(2 / (2 - w) * max(rate, 0.0) / span_s) / span_s


def _trend(state: PlannerState, now: float, rate: float) -> float:
    """The observed total rate's slope, smoothed over about 1 / TREND_WEIGHT observations (rule 3)."""
    if state.last_rate is None or now <= state.last_rate[0]:
        return state.trend
    slope = (rate - state.last_rate[1]) / (now - state.last_rate[0])
    return (1 - TREND_WEIGHT) * state.trend + TREND_WEIGHT * slope


def _scaled(classes: Mapping[str, ClassLoad], factor: float) -> dict[str, ClassLoad]:
    return {c: replace(x, rate=x.rate * factor) for c, x in classes.items()}


def plan(observation: Observation | None, costs: PodCosts | None, slo: Slo, desired: Pools, existing: Pools,
         state: PlannerState, now: float, config: PlannerConfig) -> Plan:
    """The counts to set this interval. `desired`: the counts set now (the replica fields);
    `existing`: the pods that exist now, draining ones included (they hold their GPUs)."""
    def frozen(reason: str) -> Plan:
        return Plan(desired.prefill, desired.decode, -1, reason, True, state)

    if observation is None:
        return frozen("metrics missing: no observation of the arrivals")
    if now - observation.at > config.stale_s:
        return frozen(f"metrics stale: the newest observation is {now - observation.at:.0f}s old "
                      f"(more than {config.stale_s:g}s)")
    if costs is None:
        return frozen("costs unknown: no engine has reported its measured cost yet")
    rate = sum(x.rate for x in observation.classes.values())
    span = observation.span_s or config.interval_s
    trend = _trend(state, now, rate)
    current = need(observation.classes, costs, slo, config, observation.decode_running)
    lead = config.startup_s + config.interval_s
    ahead = rate + max(trend - trend_noise(rate, span), 0.0) * lead
    upcoming = need(_scaled(observation.classes, ahead / rate), costs, slo, config) if rate > 0 else current
    kept = (need(_scaled(observation.classes, rate_bound(rate, span) / rate), costs, slo, config,
                 observation.decode_running) if rate > 0 else current)
    needs = _window(state.needs, desired, now, config.scale_down_stabilization_s,
                    (max(kept.prefill, upcoming.prefill), max(kept.decode, upcoming.decode)))
    want, held = {}, {}
    for i, pool in enumerate(POOLS):
        up = max(getattr(current, pool), getattr(upcoming, pool))
        held[pool] = max(n[i + 1] for n in needs)    # rule 4: the highest need of the window
        lo, hi = getattr(config, f"min_{pool}"), getattr(config, f"max_{pool}")
        now_set = getattr(desired, pool)
        want[pool] = min(max(up if up > now_set else min(held[pool], now_set), lo), hi)
    reason_budget = ""
    if config.gpu_budget is not None:
        want, reason_budget = _share_budget(want, config)
    target = {p: getattr(desired, p) + max(-config.max_step, min(config.max_step, want[p] - getattr(desired, p)))
              for p in POOLS}
    if config.gpu_budget is not None:
        target, waiting = _room(target, desired, existing, config)
        reason_budget = "; ".join(filter(None, (reason_budget, waiting)))
    directions, changes = _directions(state.directions, state.changes, desired, target)
    new_state = PlannerState(needs, (now, rate), trend, directions, changes)
    short = max(0, min(upcoming.short, target["prefill"]))
    reason = _reason(current, upcoming, held, desired, target, rate, trend, reason_budget, config)
    return Plan(target["prefill"], target["decode"], short, reason, False, new_state, current)


def _window(history: tuple[tuple[float, int, int], ...], desired: Pools, now: float, window_s: float,
            latest: tuple[int, int]) -> tuple[tuple[float, int, int], ...]:
    """The (time, prefill, decode) needs of the stabilisation window, with `latest` now. Without
    history, what is set counts as needed for one window (rule 4)."""
    history = history or ((now, desired.prefill, desired.decode),)
    return (*[n for n in history if n[0] > now - window_s], (now, *latest))


def _directions(directions: Mapping[str, int], changes: int, before: Pools, after: Mapping[str, int]
                ) -> tuple[dict[str, int], int]:
    """Each pool's last change (+1 | -1) and the direction changes counted so far, after `after`."""
    directions = dict(directions)
    for pool in POOLS:
        delta = after[pool] - getattr(before, pool)
        if delta:
            sign = 1 if delta > 0 else -1
            changes += directions.get(pool, sign) != sign
            directions[pool] = sign
    return directions, changes


def _share_budget(want: dict[str, int], config: PlannerConfig) -> tuple[dict[str, int], str]:
    """Rule 6, first half: what both pools want, cut to the budget in proportion to it."""
    budget = config.gpu_budget
    wanted = config.gpus(want["prefill"], want["decode"])
    if wanted <= budget:
        return want, ""
    per = {"prefill": config.gpus_per_prefill, "decode": config.gpus_per_decode}
    lo = {"prefill": config.min_prefill, "decode": config.min_decode}
    out = {p: max(lo[p], math.floor(want[p] * budget / wanted)) for p in POOLS}
    for p in sorted(POOLS, key=lambda p: out[p] / max(want[p], 1)):   # the most cut first
        while out[p] < want[p] and config.gpus(out["prefill"], out["decode"]) + per[p] <= budget:
            out[p] += 1
    return out, f"budget: {wanted} GPUs wanted, {budget} allowed"


def _room(target: dict[str, int], desired: Pools, existing: Pools, config: PlannerConfig
          ) -> tuple[dict[str, int], str]:
    """Rule 6, second half: a pool grows only into GPUs free now; the pods that exist (draining
    ones too) and those ordered stay counted until they are gone."""
    budget = config.gpu_budget
    per = {"prefill": config.gpus_per_prefill, "decode": config.gpus_per_decode}
    out, reason = dict(target), ""
    for p in POOLS:
        grow = out[p] - getattr(desired, p)
        if grow <= 0:
            continue
        other = next(q for q in POOLS if q != p)
        held = (max(getattr(existing, p), getattr(desired, p)) * per[p]
                + max(getattr(existing, other), out[other]) * per[other])
        room = (budget - held) // per[p] if per[p] else grow
        if room < grow:
            out[p] = getattr(desired, p) + max(0, room)
            reason = reason or "budget: waiting for draining pods to free their GPUs"
    return out, reason


def _reason(current: Need, upcoming: Need, held: Mapping[str, int], desired: Pools, target: dict[str, int],
            rate: float, trend: float, budget: str, config: PlannerConfig) -> str:
    moves = [f"{p} {getattr(desired, p)}->{target[p]}" for p in POOLS if target[p] != getattr(desired, p)]
    head = ", ".join(moves) if moves else "no change"
    parts = [f"{head}: {rate:.2f} req/s (trend {trend:+.3f}/s) needs prefill {current.prefill}"
             f" (short {current.short}), decode {current.decode}"]
    if (upcoming.prefill, upcoming.decode) != (current.prefill, current.decode):
        parts.append(f"ahead of start-up: prefill {upcoming.prefill}, decode {upcoming.decode}")
    if any(target[p] > getattr(current, p) and held[p] > getattr(current, p) for p in POOLS):
        parts.append(f"kept for the last {config.scale_down_stabilization_s:g}s at the rate's noise bound: "
                     f"prefill {held['prefill']}, decode {held['decode']}")
    if budget:
        parts.append(budget)
    if current.limit:
        parts.append(current.limit)
    return "; ".join(parts)


def direction_changes_per_hour(changes: int, seconds: float) -> float:
    return changes * 3600.0 / seconds if seconds > 0 else 0.0


# --- the utilisation-driven baseline ------------------------------------------------------------

@dataclass(frozen=True)
class UtilisationConfig:
    """An HPA-style rule (the Kubernetes HorizontalPodAutoscaler's algorithm on a utilisation
    metric): desired = ceil(current x utilisation / target), skipped within `tolerance` of the
    target, scale-down stabilised over a window; what autoscaling LLM pods looks like today."""
    target: float = 0.7
    tolerance: float = 0.1
    scale_down_stabilization_s: float = 300.0


@dataclass(frozen=True)
class UtilisationState:
    recommendations: tuple[tuple[float, int, int], ...] = ()
    directions: Mapping[str, int] = field(default_factory=dict)
    changes: int = 0


def utilisation_plan(utilisation: Mapping[str, float] | None, desired: Pools, state: UtilisationState, now: float,
                     config: PlannerConfig, rule: UtilisationConfig = UtilisationConfig()
                     ) -> tuple[Pools, UtilisationState, str]:
    """The baseline's counts: `utilisation` is each pool's busy share over the last interval."""
    if utilisation is None:
        return desired, state, "utilisation unknown"
    rec = {}
    for pool in POOLS:
        n, u = getattr(desired, pool), utilisation.get(pool, 0.0)
        ratio = u / rule.target
        want = n if abs(ratio - 1) <= rule.tolerance else math.ceil(n * ratio)
        rec[pool] = min(max(want, getattr(config, f"min_{pool}")), getattr(config, f"max_{pool}"))
    recs = _window(state.recommendations, desired, now, rule.scale_down_stabilization_s,
                   (rec["prefill"], rec["decode"]))
    out = {}
    for i, pool in enumerate(POOLS):
        n = getattr(desired, pool)
        out[pool] = rec[pool] if rec[pool] > n else min(n, max(r[i + 1] for r in recs))
    directions, changes = _directions(state.directions, state.changes, desired, out)
    return (Pools(out["prefill"], out["decode"]), UtilisationState(recs, directions, changes),
            f"utilisation prefill {utilisation.get('prefill', 0):.0%}, decode {utilisation.get('decode', 0):.0%}")


def drain_order(names: Sequence[str], in_flight: Mapping[str, float], ordinals: bool) -> list[str]:
    """The pods to take out first when a pool shrinks: a StatefulSet (`ordinals`) removes its
    highest ordinals, so those; otherwise the least in-flight work first, ties the highest name (the
    allocation policy's choice of which pod moves)."""
    if ordinals:
        return sorted(names, key=highest_first)
    return sorted(names, key=lambda n: (in_flight.get(n, 0.0), highest_first(n)))


def join_group(groups: Mapping[str, Sequence], short_target: int | None) -> str:
    """The group a prefill pod that starts serving joins (groups.joining_group)."""
    return joining_group(len(groups[SHORT]), len(groups[LONG]), short_target)


def keep_both_groups(groups: dict[str, tuple]) -> dict[str, tuple]:
    """After pods leave: a group left empty while the other has two or more takes one of them
    (the allocation loop moves pods only between groups that both serve)."""
    for empty, full in ((SHORT, LONG), (LONG, SHORT)):
        if not groups[empty] and len(groups[full]) >= 2:
            return {empty: groups[full][-1:], full: groups[full][:-1]}
    return groups
