"""Admission control per prefill group and per class (pure): work that cannot be served in time
is refused at once (429 + Retry-After) before it reaches an engine, so one class's overload
stays that class's problem instead of failing late, after the KV hand-off timeout. `refusal`:

1. Token bound: a group takes a request while its pending prompt tokens (`group_load`) are below
   `max_pending_tokens_per_pod` x its routable pods. A watermark, not a budget: a prompt larger
   than the bound runs when its group has room, and the queue overshoots by at most one
   request. 0 turns admission off (rule 2 with it).
2. Measured speed: a pod whose /get_load reports `max_pending_tokens` (what it prefills within
   half its KV hand-off timeout, engine/core/load_report.py) takes a request only while its
   queue plus the request fit, or when it holds nothing (`in_time`). Where routing's pod would
   not, the least loaded pod of the group that would takes it (`in_time_route`); a group with
   none refuses. A pod that reports no figure is bounded by rule 1 alone.
3. Decode share: both classes share the decode pool, so a class may hold at most
   `max_decode_share` of its slots (the routable decode pods' reported max running requests),
   from dispatch until the answer ends; unknown slots, no share. A request still queued for its
   prefill counts only if its prefill is predicted to end within the time its class's answers
   have lately held a decode slot (`share_counted`): one predicted later reaches the pool after
   today's holders have left it. Other gateway replicas' requests count from the engines'
   `held_by_class` (engine_load.py), as of the last poll.

Why each rule, where it falls short, and what it was measured to change:
docs/design/overload.md."""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from laps_agent.policy.routing import Endpoint, EndpointLoad, RouteDecision

# 16k tokens per pod: ~16 s of queued prefill for SmolLM2 on CPU (half the default bootstrap
# timeout), ~1.5 s for a 32B model on an H200 (a full 16k-token prefill batch).
DEFAULT_MAX_PENDING_TOKENS_PER_POD = 16384
# A class alone still gets three quarters of the decode slots; the other class always finds a
# quarter free, so a modest stream of it never waits behind the flood.
DEFAULT_MAX_DECODE_SHARE = 0.75


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    pending_tokens: int
    bound: int | None       # tokens; None: admission control is off


def group_bound(max_pending_tokens_per_pod: int, pods: int) -> int | None:
    """The group's bound: proportional to its routable pods (at least one pod's worth, so a
    group that just lost its pods still admits what its fallback serves); None when disabled."""
    if max_pending_tokens_per_pod <= 0:
        return None
    return max_pending_tokens_per_pod * max(pods, 1)


def admit(pending_tokens: int, pods: int, max_pending_tokens_per_pod: int) -> Admission:
    """Whether a group with `pending_tokens` pending over `pods` routable pods takes one more."""
    bound = group_bound(max_pending_tokens_per_pod, pods)
    return Admission(bound is None or pending_tokens < bound, pending_tokens, bound)


def in_time(pending_tokens: int, work: int, capacity: int | None) -> bool:
    """Whether a prefill pod with `pending_tokens` queued, which expects to prefill `capacity`
    tokens in time (None: unknown), takes a request of `work` uncached tokens more: always when
    it holds nothing."""
    return capacity is None or pending_tokens == 0 or pending_tokens + work <= capacity


def in_time_route(d: RouteDecision, tokens: int, members: Sequence[Endpoint],
                  loads: Mapping[str, EndpointLoad], capacity: Callable[[str], int | None],
                  max_pending_tokens_per_pod: int) -> tuple[RouteDecision, tuple[int, int, int | None]]:
    """`d`, unless its pod would not take the request (`tokens` prompt tokens, `d.cached` of
    them expected cached there) in time while another routable pod of its group (`members`)
    would: then `d` sent to the least loaded of those, with all the tokens as its work (the
    cached prefix is on the other pod). Admission off (a bound of 0): `d`. With the route, its
    _pod_queue (refusal's `pod`)."""
    pod = _pod_queue(d, tokens, loads, capacity)
    if max_pending_tokens_per_pod <= 0 or in_time(*pod):
        return d, pod
    fitting = []
    for e in members:
        if e.name != d.prefill.name and loads.get(e.name, _IDLE).healthy:
            moved = replace(d, prefill=e, cached=0)   # its cached prefix is on d's pod
            if in_time(*(there := _pod_queue(moved, tokens, loads, capacity))):
                fitting.append((moved, there))
    # None fitting: d, and refusal says why.
    return min(fitting, key=lambda f: f[1][0]) if fitting else (d, pod)


def _pod_queue(d: RouteDecision, tokens: int, loads: Mapping[str, EndpointLoad],
               capacity: Callable[[str], int | None]) -> tuple[int, int, int | None]:
    """(pending tokens, the request's work, measured capacity) of the prefill pod of route `d`
    for a `tokens`-token prompt: `in_time`'s arguments, `refusal`'s `pod`."""
    return loads.get(d.prefill.name, _IDLE).pending_tokens, d.work(tokens), capacity(d.prefill.name)


def group_load(members: Sequence[Endpoint], loads: Mapping[str, EndpointLoad],
               own_pending_tokens: int) -> tuple[int, int]:
    """(routable pods, pending tokens) of a group whose pods are `members`. The pods' tokens
    come from `loads` (merged with the engines' reports: every gateway replica's work); this
    gateway's own count of the group is kept when it is more (a pod moved to the other group
    takes the tokens of the requests it holds along)."""
    pods = sum(1 for e in members if loads.get(e.name, _IDLE).healthy)
    return pods, max(own_pending_tokens, sum(loads.get(e.name, _IDLE).pending_tokens for e in members))


_IDLE = EndpointLoad()


def decode_slots(members: Sequence[Endpoint], loads: Mapping[str, EndpointLoad],
                 reported: Callable[[str], int | None]) -> int:
    """The decode pool's slots: the reported max running requests of its routable pods (0 when
    none reported it)."""
    return sum(reported(e.name) or 0 for e in members if loads.get(e.name, _IDLE).healthy)


def decode_held(members: Sequence[Endpoint], loads: Mapping[str, EndpointLoad], cls: str, own: int,
                others: Callable[[str, str], int]) -> int:
    """Requests of class `cls` on the decode pool: this gateway's (`own`) plus those other
    replicas hold on its routable pods (`others(pod, cls)`, 0 where a pod reports no classes);
    a pod out of the pool adds none, as it adds no slots."""
    return own + sum(others(e.name, cls) for e in members if loads.get(e.name, _IDLE).healthy)


def gateway_decode_share(single_pool: bool, share: float | None = None) -> float:
    """The decode share a gateway runs with: `share` where one is set, else DEFAULT_MAX_DECODE_SHARE,
    but none in front of one pool (`laps local --single-pool`, the simulator's one-pool systems):
    its pods serve every request alike, so there is no class to keep decode slots free for."""
    if share is not None:
        return share
    return 0.0 if single_pool else DEFAULT_MAX_DECODE_SHARE


# How much the last answer weighs in a class's decode residence (about the last 20 answers).
DECODE_RESIDENCE_WEIGHT = 0.05


def share_counted(prefill_ends: Sequence[float], now: float, residence_s: float | None) -> int:
    """How many of a class's requests still queued for their prefill, predicted to end it at
    `prefill_ends` (sorted; the clock of `now`), hold a place in its decode share now: those
    predicted to reach the decode pool within `residence_s`, the seconds its answers have lately
    held a decode slot (from the KV hand-off to the last byte). Before any answer has ended
    (None), all of them: a flood of long answers is bounded from its first request.
    (Counted from dispatch alone, longs queued behind a burst's shorts filled the long share
    while the decode engines idled: docs/design/placement.md.)"""
    if residence_s is None:
        return len(prefill_ends)
    return bisect_left(prefill_ends, now + residence_s)


def residence_update(residence_s: float | None, seconds: float) -> float:
    """A class's decode residence after an answer held its slot for `seconds`."""
    if residence_s is None:
        return seconds
    return residence_s + DECODE_RESIDENCE_WEIGHT * (seconds - residence_s)


def decode_share_bound(share: float, slots: int) -> int | None:
    """The most requests one class may hold on a decode pool of `slots` (None: no bound); at
    least one, so a pool of few slots still serves both classes."""
    return max(1, int(share * slots)) if share > 0 and slots > 0 else None


def refusal(d: RouteDecision, group: tuple[int, int], held: int, slots: int,
            max_pending_tokens_per_pod: int, max_decode_share: float,
            pod: tuple[int, int, int | None] = (0, 0, None)) -> str | None:
    """Why a request routed as `d` is refused (None: admitted). `group`: (routable pods,
    pending tokens) of its prefill group; `pod`: (pending tokens, the request's work, measured
    capacity) of the prefill pod it is routed to (`in_time`); `held`: its class's requests on
    the decode pool of `slots` slots."""
    pods, pending = group
    verdict = admit(pending, pods, max_pending_tokens_per_pod)
    if not verdict.admitted:
        why = (f"the {d.group} prefill group is overloaded: {pending} prompt tokens pending, its "
               f"bound is {verdict.bound} ({max_pending_tokens_per_pod} per pod x {pods} pods)")
    elif verdict.bound is not None and not in_time(*pod):   # 0 turns the token bound and this off
        why = (f"the {d.group} prefill group is overloaded: its pod {d.prefill.name} holds {pod[0]} "
               f"prompt tokens, and with this request's {pod[1]} more it would not prefill them "
               f"within half its KV hand-off timeout at its measured speed (about {pod[2]} tokens)")
    else:
        bound = decode_share_bound(max_decode_share, slots)
        if bound is None or held < bound:
            return None
        why = (f"the {d.cls} class is overloaded in the decode pool: it holds {held} requests, "
               f"its share is {bound} ({max_decode_share:g} of {slots} decode slots)")
    return why + "; work for it is refused until it drains, retry later"
