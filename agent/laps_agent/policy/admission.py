"""Admission control per prefill group (pure): bounded pending work, so one class's overload
stays that class's problem.

Without a bound, a load that shifts to long prompts grows the long group's queue until its
requests outlast the engines' KV hand-off timeout; then every one of them fails late, after
holding a decode slot. With a bound, a group takes a new request while its pending prompt
tokens (`group_load`: its pods' loads as routing sees them, other gateway replicas' work
included when the engines report it, or the gateway's own count if that is more) are below
`max_pending_tokens_per_pod` times its routable pods; beyond it the request is refused at once
(429 + Retry-After) before it reaches any engine, and the other group is unaffected.

The bound is a watermark, not a budget: a request is admitted whenever the group is below it,
whatever its own size, so a prompt larger than the bound still runs when its group has room, and
the queue overshoots the bound by at most one request. Choose the bound so that a pod prefills
that much well within the engines' --bootstrap-timeout (30 s): a 32B model on an H200 prefills
about 10,000 tokens/s, SmolLM2 on two CPU cores 250 (3,000-token prompts) to 1,000 (short ones).

The engines also measure it themselves: a pod whose /get_load reports `max_pending_tokens`
(what it expects to prefill within half its KV hand-off timeout at its measured speed,
engine/load_report.py; this project's prefill engines, from start-up on) takes a
request only while its queue and that request together stay within it (`in_time`), or when it
holds nothing (so a prompt longer than that still runs). The check is on the pod the request
would join, and counts the request itself: a watermark lets one request past it, which at the
measured speed is one request too late. When the pod routing chose (by cache affinity, or by
pending tokens where pods differ in speed) would not take it in time, the least loaded pod of
the group that would takes it instead (`in_time_route`), and only a group with none refuses.
Without this a slow pod's queue under the token bound outlasts the timeout: on two CPU cores, a
burst of 3,000-token chats was admitted up to 18,000 tokens, and the ones at its back failed with
503 after 30 s instead of a 429 at once. The engines measure their speed at start-up too
(engine/calibration.py), so a fresh pod's first burst is bounded by it. A pod that reports none
(stock SGLang, a decode-only pod, no fresh answer) is bounded by the token bound alone; a
token bound of 0 (admission off) turns this off too. A prompt longer than a pod's figure (one
that alone takes over half the timeout: long prompts on a CPU; never on a GPU, whose figure is
well past the context) waits for an idle pod, so under a steady stream of shorter ones of its
group it gets 429s until the stream pauses.

The decode pool is shared by both classes, so a bound on prefill alone does not isolate them: a
flood of long requests with long answers prefills quickly, then piles up in the decode engines
(their running slots, then their FIFO queue of arrived KV, then their queue bound's 503s), and
every short request waits behind it (measured on emulated engines: short TTFT from 0.02 s to
14 s p50, then 503s for both classes). So each class also has a **decode share**: it may hold
at most `max_decode_share` of the decode pool's slots (the routable decode pods' max running
requests, as their load reports say), counting its requests from dispatch until their answer
ends; beyond, that class gets 429 while the other always finds slots free. Unknown slots (no
reports: polling off, an engine without the figure) mean no decode share.

With several gateway replicas the share holds over all of them: a class's count is this
gateway's own requests plus what the other replicas hold on the routable decode pods, from the
engines' `held_by_class` (engine_load.py merges it as it does pending tokens). Each replica sees
the others' requests as of its last poll (`--engine-load-interval`), so a burst reaching every
replica within one interval may overshoot the share by what the others admitted meanwhile;
from the next poll on they refuse it. Stock SGLang reports no classes (its /v1/loads): over
it, and with polling off, each replica counts its own requests alone, so N replicas let a class
hold up to N times its share."""
from __future__ import annotations

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
