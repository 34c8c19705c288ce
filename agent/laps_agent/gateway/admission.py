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
that much well within the engines' --bootstrap-timeout (30 s): SmolLM2 on a CPU prefills about
1,000 tokens/s, a 32B model on an H200 about 10,000/s."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from laps_agent.gateway.routing import Endpoint, EndpointLoad

# 16k tokens per pod: ~16 s of queued prefill for SmolLM2 on CPU (half the default bootstrap
# timeout), ~1.5 s for a 32B model on an H200 (a full 16k-token prefill batch).
DEFAULT_MAX_PENDING_TOKENS_PER_POD = 16384


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


def group_load(members: Sequence[Endpoint], loads: Mapping[str, EndpointLoad],
               own_pending_tokens: int) -> tuple[int, int]:
    """(routable pods, pending tokens) of a group whose pods are `members`. The pods' tokens
    come from `loads` (merged with the engines' reports: every gateway replica's work); this
    gateway's own count of the group is kept when it is more (a pod moved to the other group
    takes the tokens of the requests it holds along)."""
    pods = sum(1 for e in members if loads.get(e.name, _IDLE).healthy)
    return pods, max(own_pending_tokens, sum(loads.get(e.name, _IDLE).pending_tokens for e in members))


_IDLE = EndpointLoad()
