"""Where a request goes, or why it is refused: one decision by predicted time to first token.

Every usable prefill pod predicts when this request's prefill would end there, from what it is
predicted to hold (EndpointLoad: pending requests and uncached tokens, the short ones apart) and
its measured cost of a prefill batch (seconds = overhead + per-token x tokens, the engine's own
fit: scheduling/window.py). The prediction honours the pod's dual queue:
- a short request waits for a long batch that may be running and the shorts ahead of it, then
  runs in their batch;
- a long request waits for everything ahead, one batch per `batch_tokens` of shorts and per
  long batch budget of longs (the engines' max_long_batch_tokens);
- less what the running batch has done: the gateway takes it to have begun at its first
  dispatch to the pod idle, else at the pod's last prefill end (EndpointLoad.batch_since), and
  credits the time since, at most that batch's length (a short behind several long batches: what
  is left of the one then under way, the batches back to back, as the gateway counts a long until
  its KV is handed off); never less than the request's own prefill.
The request's class and work at a pod are its *expected uncached* tokens there (cache affinity:
`held`), so a conversation goes back to the pod holding its prefix exactly when that is faster.

The length groups are a preference, not a wall:
- a short request goes to the pod that would serve it first, wherever it is (a long-group pod
  serves it before its queued longs);
- a long request goes to the long group, except to a short-group pod where it would finish
  no later than it would start in the long group plus p x its own prefill there, p the short
  group's need of protection (`ArrivalMix.protection`: 1 while at least FULL_PROTECTION_SHARE of
  recent requests are short, falling to 0 with none): with shorts around, only when the long
  group would hold it back longer than it runs; with none, wherever it finishes first (one pool);
  and wherever its own batch there is short enough that a short arriving behind it would still
  start within SPILL_SLO_SHARE of its TTFT SLO (the gateway's --slo).
  The shorts route around that pod while its long batch runs. With no usable long-group pod it
  goes to the short group.
Pods of one hardware (measured costs within SAME_HARDWARE_SHARE of their mean) predict with that
mean, so fitting noise does not rank them. Equal predictions (within TIE_SHARE) prefer an idle
pod (its prediction is exact; a busy one's an estimate, and the gateway's clock of its batch may
run ahead of the engine's), then the request's own group, then take turns.
Admission: a pod takes the request when it holds nothing, or when its predicted prefill end
is within the token watermark at the pod's cost and, where the pod reports what it prefills in
time (its KV hand-off bound), within that. The chosen pod is the best one that takes it among
those the request may use; failing those, a long goes to a short-group pod that takes it, one
already holding long work first (a short there waits for the long batch under way either way);
it is refused (429) only when none would. So prefill admission sheds no request while a prefill
pod idles (the decode share, admission.py rule 3, still refuses a class holding its share).
The decode pod is the least loaded (routing.py's rule), and a class holding its share of the
decode slots is refused (admission.py rule 3). The gateway and `laps sim` both call `place`.
Why this rule, and what it changed on the workload matrix: docs/design/placement.md."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import AbstractSet

from laps_agent.policy.admission import decode_share_bound
from laps_agent.policy.classes import LONG, SHORT, length_class
from laps_agent.policy.routing import Endpoint, EndpointLoad, NoEndpointError, RouteDecision, describe, least_loaded
from laps_agent.policy.scheduling.config import SchedulerConfig, long_batch_budget

# A pod's largest prefill batch where it does not report its own (`batch_tokens`; stock SGLang
# does not): the H200 profile's --max-prefill-tokens and SGLang's default chunk.
DEFAULT_BATCH_TOKENS = 16384
# A pod's long batch budget where it does not report its own (the dual queue's
# max_long_batch_tokens, 0: its whole batch budget; stock SGLang with the plugin does not).
DEFAULT_LONG_BATCH_TOKENS = SchedulerConfig.max_long_batch_tokens


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """A prefill batch of T uncached tokens takes overhead_s + per_token_s x T seconds."""
    overhead_s: float
    per_token_s: float

    def seconds(self, tokens: int, batches: int = 1) -> float:
        return batches * self.overhead_s + self.per_token_s * tokens


# Predictions this close are equal: each pod's cost is its own fit of its own batches, and pods
# of the same hardware differ by noise; without it the one that measured fastest took every
# request while the others idled.
TIE_SHARE = 0.02

# Pods whose measured costs (of a batch of `threshold` tokens) are within this share of the
# pods' mean are one hardware and predict with that mean: each pod's fit carries its own noise
# (the 72B profile's emulated pods differ by up to 15%), and the pod that measured fastest drew
# the shorts while others idled (docs/design/placement.md). One further off keeps its own.
SAME_HARDWARE_SHARE = 0.25

# A long may join a short-group pod whenever the long batch it would run there is at most this
# share of the short TTFT SLO: a short arriving behind it still starts in time, with the rest of
# the SLO for its own prefill, the KV hand-off and its first decode step.
SPILL_SLO_SHARE = 0.6

# Before a pod has reported its cost: predictions in token-units (one per token, no overhead),
# which rank pods as the pending-token rule did and turn a token bound into itself.
UNMEASURED = PrefillCost(0.0, 1.0)


class ArrivalMix:
    """The share of recent requests that were short (by their full prompt length), weighted
    exponentially over about 1/WEIGHT requests (the plain mean of the first 1/WEIGHT), and from
    it how much the short group needs protecting from long work. Protects fully before the first
    request. (Starting from a share of 1 at the exponential weight, uniformly long traffic kept
    the short group to itself for its first 150 requests.)"""
    WEIGHT = 0.02
    # Even a few percent of short requests want their pods kept free of long batches (their SLO
    # is the tight one): weighting the spill by the share itself lost attainment on long-heavy
    # mixes (15% short); only traffic with almost no short request is served as one pool.
    FULL_PROTECTION_SHARE = 0.05

    def __init__(self) -> None:
        self.short_share = 1.0
        self.seen = 0

    def observe(self, short: bool) -> float:
        self.seen += 1
        weight = max(self.WEIGHT, 1.0 / self.seen)   # the first request's: 1
        self.short_share += weight * ((1.0 if short else 0.0) - self.short_share)
        return self.short_share

    @property
    def protection(self) -> float:
        return min(1.0, self.short_share / self.FULL_PROTECTION_SHARE)


@dataclass(frozen=True, slots=True)
class Placement:
    route: RouteDecision | None    # None: refused
    predicted_s: float             # the prefill's predicted end on the chosen pod (refused: the best)
    refusal: str | None = None     # why it is refused (then 429); None: placed
    in_seconds: bool = True        # False: predicted_s is in token-units (no pod measured its cost yet)

    def prefill_end_at(self, now: float) -> float | None:
        """When the placed request's prefill is predicted to end on the clock of `now` (None:
        refused, or not predicted in seconds)."""
        return now + self.predicted_s if self.route is not None and self.in_seconds else None


@dataclass(slots=True)
class _Candidate:
    endpoint: Endpoint
    group: str
    cls: str
    work: int
    held: int
    predicted_s: float
    own_s: float        # its own prefill's seconds there
    load: EndpointLoad
    cost: PrefillCost
    batch: int          # its largest batch of the request's class, tokens (a long's: the long budget)


def predicted_seconds(load: EndpointLoad, cost: PrefillCost, cls: str, work: int,
                      batch_tokens: int = DEFAULT_BATCH_TOKENS, elapsed_s: float = 0.0,
                      long_batch_tokens: int = DEFAULT_LONG_BATCH_TOKENS) -> float:
    """When a request of class `cls` and `work` uncached tokens would finish its prefill on a pod
    holding `load`, from now (the module docstring's dual-queue rule), its running batch begun
    `elapsed_s` ago; its long batches of `long_batch_tokens` at most (within `batch_tokens`; 0:
    all of it)."""
    long_budget = long_batch_budget(batch_tokens, long_batch_tokens)
    short_tokens = max(0, load.short_tokens)
    long_tokens = max(0, load.pending_tokens - short_tokens)
    long_requests = max(0, load.pending_requests - load.short_requests)
    one_long, long_batches = _long_batches(long_requests, long_tokens, long_budget)
    long_batch = cost.seconds(one_long) if long_requests else 0.0
    if cls == SHORT:
        ahead = short_tokens + work
        total = long_batch + cost.seconds(ahead, math.ceil(ahead / batch_tokens))
    else:
        batches = math.ceil(short_tokens / batch_tokens) + math.ceil((long_tokens + work) / long_budget)
        total = cost.seconds(short_tokens + long_tokens + work, batches)
    if elapsed_s <= 0.0:
        return total
    # What of the running batch (a long one where longs are queued, else the shorts') is done.
    first = long_batch or (cost.seconds(min(short_tokens, batch_tokens)) if short_tokens else 0.0)
    done = min(elapsed_s, first)
    if cls == SHORT and long_batches > 1 and first <= elapsed_s < long_batches * long_batch:
        # Past the first long batch's length the next is running, not none: the gateway still
        # counts the first until its KV is handed off (docs/design/placement.md).
        done = elapsed_s % long_batch
    return max(cost.seconds(work, math.ceil(work / batch_tokens)), total - done)


def _shared_costs(costs: dict[str, PrefillCost | None], tokens: int) -> dict[str, PrefillCost | None]:
    """The pods' measured costs, those within SAME_HARDWARE_SHARE of their mean (at `tokens`)
    replaced by that mean; unmeasured pods stay None."""
    measured = [c for c in costs.values() if c is not None]
    if len(measured) < 2:
        return costs
    mean = PrefillCost(sum(c.overhead_s for c in measured) / len(measured),
                       sum(c.per_token_s for c in measured) / len(measured))
    at = mean.seconds(max(1, tokens))
    return {name: mean if c is not None and abs(c.seconds(max(1, tokens)) - at) <= SAME_HARDWARE_SHARE * at else c
            for name, c in costs.items()}


def _long_batches(requests: int, tokens: int, batch_tokens: int) -> tuple[int, int]:
    """The tokens of the long batch that may be running, and how many such batches the pod's
    longs make: as many whole longs of the mean size as fit in one batch, at least one (the
    engine batches them FIFO up to `batch_tokens`)."""
    if requests <= 0 or tokens <= 0:
        return 0, 0
    mean = tokens / requests
    per_batch = max(1, int(batch_tokens // max(mean, 1)))
    return int(min(tokens, per_batch * mean)), math.ceil(requests / per_batch)


def place(tokens: int, threshold: int, groups: Mapping[str, Sequence[Endpoint]], decode: Sequence[Endpoint],
          loads: Mapping[str, EndpointLoad], cost: Callable[[str], PrefillCost | None], *,
          held: Callable[[Endpoint], int] | None = None, exclude: AbstractSet[str] = frozenset(),
          tiebreak: int = 0, batch_tokens: Callable[[str], int | None] = lambda name: None,
          long_batch_tokens: Callable[[str], int | None] = lambda name: None,
          max_pending_tokens_per_pod: int = 0, capacity: Callable[[str], int | None] = lambda name: None,
          decode_held: Callable[[str], int] = lambda cls: 0, decode_slots: int = 0,
          max_decode_share: float = 0.0, protection: float = 1.0, now: float | None = None,
          ttft_slo_s: Mapping[str, float] | None = None) -> Placement:
    """The placement of a request of `tokens` prompt tokens (the module docstring). `cost(pod)`:
    its measured prefill cost (None: not yet; another pod's, else UNMEASURED, stands in);
    `held(pod)`: its prompt tokens that pod is expected to hold (None: no affinity);
    `batch_tokens(pod)`: its largest prefill batch (None: DEFAULT_BATCH_TOKENS);
    `long_batch_tokens(pod)`: its max_long_batch_tokens (None: DEFAULT_LONG_BATCH_TOKENS);
    `now`: the clock of the loads' `batch_since` (None: no batch credited);
    `max_pending_tokens_per_pod` 0: no admission bound (nor the in-time one); `capacity(pod)`:
    the tokens it reports it prefills in time; `decode_held(cls)`: requests of that class on the
    decode pool of `decode_slots` slots; `protection`: ArrivalMix.protection; `ttft_slo_s`: the
    TTFT SLO per class (None: no long batch is short enough to pass the protection). Raises
    NoEndpointError when no pod is usable."""
    pooled = not groups.get(LONG)
    costs = _shared_costs({e.name: cost(e.name) for eps in groups.values() for e in eps}, threshold)
    stand_in = next((c for c in costs.values() if c is not None), UNMEASURED)
    candidates: list[_Candidate] = []
    for group in (SHORT, LONG):
        for ep in groups.get(group, ()):
            load = loads.get(ep.name, _IDLE)
            if ep.name in exclude or not load.healthy:
                continue
            got = held(ep) if held is not None else 0
            work = max(1, tokens - got)
            cls = length_class(work, threshold)
            pod_cost = costs[ep.name] or stand_in
            batch = batch_tokens(ep.name) or DEFAULT_BATCH_TOKENS
            long_budget = long_batch_tokens(ep.name)
            long_budget = DEFAULT_LONG_BATCH_TOKENS if long_budget is None else long_budget
            timed = now is not None and load.batch_since is not None and pod_cost is not UNMEASURED
            elapsed = now - load.batch_since if timed else 0.0   # (unmeasured: predictions in tokens)
            predicted = predicted_seconds(load, pod_cost, cls, work, batch, elapsed, long_budget)
            class_batch = batch if cls == SHORT else long_batch_budget(batch, long_budget)
            candidates.append(_Candidate(ep, group, cls, work, got, predicted,
                                         pod_cost.seconds(min(work, batch)), load, pod_cost, class_batch))
    if not candidates:
        raise NoEndpointError(f"no usable prefill pod for a request ({tokens} tokens): "
                              + "; ".join(describe(f"prefill-{g}", groups.get(g, ()), loads, exclude) for g in (SHORT, LONG)))
    allowed = candidates if pooled else _allowed(candidates, protection, (ttft_slo_s or {}).get(SHORT))
    order = _preference(allowed, tiebreak)
    best = order[0]
    chosen = next((c for c in order if _takes(c, max_pending_tokens_per_pod, capacity)), None)
    if chosen is None:   # a long its pods refuse: short-group pods holding long work first, then any
        for spill in ([c for c in candidates if c not in allowed and _holds_long(c)],
                      [c for c in candidates if c not in allowed and not _holds_long(c)]):
            if chosen is None and spill:
                chosen = next((c for c in _preference(spill, tiebreak)
                               if _takes(c, max_pending_tokens_per_pod, capacity)), None)
    decode_ep = least_loaded(decode, loads, exclude, tiebreak)
    if decode_ep is None:
        raise NoEndpointError(f"no usable decode pod: {describe('decode', decode, loads, exclude)}")
    if chosen is None:
        return Placement(None, best.predicted_s, _refusal(best, max_pending_tokens_per_pod))
    route = RouteDecision(chosen.cls, chosen.group, chosen.endpoint, decode_ep,
                          fallback=not pooled and chosen.group != chosen.cls, cached=chosen.held)
    share = decode_share_bound(max_decode_share, decode_slots)
    if share is not None and (holding := decode_held(chosen.cls)) >= share:
        return Placement(None, chosen.predicted_s,
                         f"the {chosen.cls} class is overloaded in the decode pool: it holds {holding} requests, "
                         f"its share is {share} ({max_decode_share:g} of {decode_slots} decode slots); "
                         f"retry later")
    return Placement(route, chosen.predicted_s, in_seconds=chosen.cost is not UNMEASURED)


def _preference(allowed: list[_Candidate], tiebreak: int) -> list[_Candidate]:
    """The candidates best first: those predicting within TIE_SHARE of the best are equals (idle
    pods first, then its own group, then a rotation by `tiebreak`, so that equal pods share the
    work), then the others by prediction."""
    best = min(c.predicted_s for c in allowed)
    n = len(allowed)
    near = [i for i in range(n) if allowed[i].predicted_s <= best * (1 + TIE_SHARE)]
    rest = sorted((i for i in range(n) if i not in near), key=lambda i: allowed[i].predicted_s)
    near.sort(key=lambda i: (allowed[i].load.pending_requests > 0,
                             allowed[i].group != allowed[i].cls, (i - tiebreak) % n))
    return [allowed[i] for i in near + rest]


def _allowed(candidates: list[_Candidate], protection: float, short_slo_s: float | None) -> list[_Candidate]:
    """The pods the request may use (the module docstring's group preference)."""
    home = [c for c in candidates if c.group == c.cls or c.cls == SHORT]
    longs_home = [c for c in candidates if c.cls == LONG and c.group == LONG]
    if not any(c.cls == LONG for c in candidates) or not longs_home:
        return candidates   # short everywhere, or a long with no long-group pod: any pod
    best_home = min(c.predicted_s for c in longs_home)
    spill = [c for c in candidates if c.cls == LONG and c.group == SHORT and
             (c.predicted_s + protection * c.own_s <= best_home or _short_enough(c, short_slo_s))]
    return home + spill


def _short_enough(c: _Candidate, short_slo_s: float | None) -> bool:
    """Whether the long batch this long would run on pod `c` (its own prefill, within the pod's
    long batch budget) leaves a short arriving behind it in time: at most SPILL_SLO_SHARE of the
    short TTFT SLO."""
    return short_slo_s is not None and c.cost is not UNMEASURED and \
        c.cost.seconds(min(c.work, c.batch)) <= SPILL_SLO_SHARE * short_slo_s


def _holds_long(c: _Candidate) -> bool:
    return c.load.pending_requests > c.load.short_requests


def _bound_s(c: _Candidate, max_pending_tokens_per_pod: int) -> float:
    """The latest predicted prefill end pod `c` takes a request with: the token watermark at its
    cost, in the pod's batches of the request's class (inf: no bound)."""
    if max_pending_tokens_per_pod <= 0:
        return math.inf
    return c.cost.seconds(max_pending_tokens_per_pod, math.ceil(max_pending_tokens_per_pod / c.batch))


def _refusal(best: _Candidate, max_pending_tokens_per_pod: int) -> str:
    if best.cost is UNMEASURED:   # its figures are tokens, not seconds
        why = (f"would have {best.predicted_s:.0f} prompt tokens to prefill with it (its bound: "
               f"{max_pending_tokens_per_pod})")
    else:
        why = (f"would end its prefill in {best.predicted_s:.3g} s, {best.load.pending_tokens} tokens queued "
               f"ahead (its bound: {_bound_s(best, max_pending_tokens_per_pod):.3g} s, {max_pending_tokens_per_pod} "
               f"tokens at its measured speed)")
    return f"no prefill pod would prefill this {best.cls} request in time: the best, {best.endpoint.name}, {why}; retry later"


def _takes(c: _Candidate, max_pending_tokens_per_pod: int, capacity: Callable[[str], int | None]) -> bool:
    """Whether pod `c` takes the request: always when it holds nothing (however large the
    prompt); else when its predicted prefill end is within the watermark and, where the pod
    reports what it prefills in time, within that."""
    if c.load.pending_tokens <= 0 or max_pending_tokens_per_pod <= 0:
        return True
    if c.predicted_s > _bound_s(c, max_pending_tokens_per_pod):
        return False
    in_time = capacity(c.endpoint.name)
    return in_time is None or c.predicted_s <= c.cost.seconds(in_time)


_IDLE = EndpointLoad()
