"""Pure routing policy of the gateway: class by length, least-loaded prefill and decode pods,
and (given what each pod is expected to hold) cache affinity with a load bound.

Prefill pod: in the group of the request's class ("short" | "long"), the pod with the fewest
pending tokens, then fewest pending requests, then a rotation by `tiebreak` among the pods still
tied (equal pods share the load deterministically). Unhealthy and excluded pods are skipped; a
class whose group has no usable pod is served by the other (fallback=True). The decode pod is
chosen the same way. This runs once per request, so it allocates nothing per endpoint; it is
also the simulator's router (laps_agent.lab.sim): one policy, several drivers.

Cache affinity (`held` given: the prompt tokens each pod is expected to hold, gateway/prefix.py):
the class is the *expected uncached* length at the pod that would serve it. Each group's
candidate is its pod holding the longest prefix within the load bound (`AffinityBound`), else
its least-loaded pod. Then:
1. the short group's candidate leaves a short uncached length -> short, there;
2. else the long group's candidate does (its own dual queue serves it as short) -> short, there;
3. else long: on the long group's candidate, or on the short group's where that one holds more
   of the prompt, and at least `threshold` tokens more (then in that pod's own long queue).
So a conversation sticks to the pod of its earlier turns while that pod stays within the bound.
Why rule 3's margin, and what affinity gives: docs/design/cache-affinity.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Callable, Mapping, Sequence

from laps_agent.policy.classes import LONG, OTHER, SHORT, length_class


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    url: str
    bootstrap_host: str
    bootstrap_port: int | None


@dataclass(slots=True)
class EndpointLoad:
    pending_requests: int = 0
    pending_tokens: int = 0
    healthy: bool = True
    # Of the pending work on a prefill pod, what was sent as short (placement.py predicts a
    # short's wait from these alone: the pod's dual queue serves it before its longs).
    short_requests: int = 0
    short_tokens: int = 0
    # When the prefill pod's running batch is taken to have begun (the tracker's clock): the
    # first dispatch to it idle, else its last prefill's end. None: unknown.
    batch_since: float | None = None


@dataclass(frozen=True, slots=True)
class RouteDecision:
    cls: str            # the request's class: "short" | "long"
    group: str          # the group that serves it (differs from cls on fallback)
    prefill: Endpoint
    decode: Endpoint
    fallback: bool
    cached: int = 0     # prompt tokens the prefill pod is expected to hold (affinity); 0: none

    def work(self, tokens: int) -> int:
        """The prefill work of a `tokens`-token prompt on this route's pod: what that pod is
        expected not to hold (what the gateway books on it and admission weighs), at least 1."""
        return max(1, tokens - self.cached)


@dataclass(frozen=True, slots=True)
class AffinityBound:
    """When a pod holding a request's prefix may still get it (consistent hashing with bounded
    loads, Mirrokni et al.): its pending tokens must be at most load_factor x its group's mean
    plus slack_tokens; a pod beyond loses affinity and the request goes by load."""
    # 1.5: the hot-spot target (issue 12) is max pod load <= 1.5x its group's mean; affinity
    # never sends work to a pod past that, so it cannot create such a hot spot by itself.
    load_factor: float = 1.5
    # Near idle, the mean is tiny and one in-flight prompt puts a pod "far above" it; the slack
    # (about one long prompt) keeps conversations sticky at low load, where spreading gains nothing.
    slack_tokens: int = 2048


DEFAULT_AFFINITY_BOUND = AffinityBound()


class NoEndpointError(Exception):
    """No usable endpoint; the message names what is missing."""


_UNKNOWN = EndpointLoad()   # a pod the load tracker has not seen yet: healthy and idle


def least_loaded(endpoints: Sequence[Endpoint], load: Mapping[str, EndpointLoad],
                  exclude: AbstractSet[str], tiebreak: int) -> Endpoint | None:
    best_tokens = best_requests = -1
    ties = 0
    for ep in endpoints:
        if ep.name in exclude:
            continue
        state = load.get(ep.name, _UNKNOWN)
        if not state.healthy:
            continue
        tokens, requests = state.pending_tokens, state.pending_requests
        if best_tokens < 0 or tokens < best_tokens or (tokens == best_tokens and requests < best_requests):
            best_tokens, best_requests, ties = tokens, requests, 1
        elif tokens == best_tokens and requests == best_requests:
            ties += 1
    if ties == 0:
        return None
    pick = tiebreak % ties
    for ep in endpoints:  # second pass: the pick-th of the tied pods, in list order
        if ep.name in exclude:
            continue
        state = load.get(ep.name, _UNKNOWN)
        if state.healthy and state.pending_tokens == best_tokens and state.pending_requests == best_requests:
            if pick == 0:
                return ep
            pick -= 1
    raise AssertionError("unreachable: a tied endpoint vanished between passes")


def describe(name: str, endpoints: Sequence[Endpoint], load: Mapping[str, EndpointLoad],
              exclude: AbstractSet[str]) -> str:
    if not endpoints:
        return f"{name}: no pods"
    excluded = sum(1 for ep in endpoints if ep.name in exclude)
    unhealthy = sum(1 for ep in endpoints if ep.name not in exclude and not load.get(ep.name, _UNKNOWN).healthy)
    parts = [f"{unhealthy} unhealthy"] if unhealthy else []
    if excluded:
        parts.append(f"{excluded} excluded after failures")
    return f"{name}: {len(endpoints)} pods, " + ", ".join(parts)


def _affine(endpoints: Sequence[Endpoint], load: Mapping[str, EndpointLoad], exclude: AbstractSet[str],
            tiebreak: int, held: Callable[[Endpoint], int], bound: AffinityBound) -> tuple[Endpoint | None, int]:
    """The group's pod holding the longest prefix within the load bound (ties: fewer pending
    tokens, then list order), with the tokens it holds; else the least-loaded pod and 0."""
    total = count = 0
    for ep in endpoints:
        state = load.get(ep.name, _UNKNOWN)
        if ep.name not in exclude and state.healthy:
            total += state.pending_tokens
            count += 1
    if count == 0:
        return None, 0
    limit = bound.load_factor * total / count + bound.slack_tokens
    best: Endpoint | None = None
    best_held = best_load = 0
    for ep in endpoints:
        state = load.get(ep.name, _UNKNOWN)
        if ep.name in exclude or not state.healthy or state.pending_tokens > limit:
            continue
        got = held(ep)
        if got > best_held or (got == best_held and got > 0 and state.pending_tokens < best_load):
            best, best_held, best_load = ep, got, state.pending_tokens
    if best is not None:
        return best, best_held
    return least_loaded(endpoints, load, exclude, tiebreak), 0


def _affine_route(tokens: int, threshold: int, groups: Mapping[str, Sequence[Endpoint]],
                  load: Mapping[str, EndpointLoad], exclude: AbstractSet[str], tiebreak: int,
                  held: Callable[[Endpoint], int], bound: AffinityBound) -> tuple[str, str, Endpoint | None, bool, int]:
    """(class, group, prefill pod or None, fallback, expected cached tokens): rules 1-3 above."""
    short, short_held = _affine(groups.get(SHORT, ()), load, exclude, tiebreak, held, bound)
    if short is not None and length_class(tokens - short_held, threshold) == SHORT:
        return SHORT, SHORT, short, False, short_held
    long_, long_held = _affine(groups.get(LONG, ()), load, exclude, tiebreak, held, bound)
    if long_ is not None:
        cls = length_class(tokens - long_held, threshold)
        if cls == LONG and short is not None and short_held > long_held and short_held - long_held >= threshold:
            return LONG, SHORT, short, False, short_held   # rule 3: where much more of it is held
        # A short request on a long pod is a fallback only if no short pod could take it at all.
        return cls, LONG, long_, cls == SHORT and short is None, long_held
    if short is not None:  # long work, and no usable long pod: the short group serves it
        return LONG, SHORT, short, True, short_held
    return length_class(tokens, threshold), LONG, None, True, 0


def choose_route(tokens: int, threshold: int, groups: Mapping[str, Sequence[Endpoint]],
                 decode: Sequence[Endpoint], load: Mapping[str, EndpointLoad],
                 exclude: AbstractSet[str] = frozenset(), tiebreak: int = 0,
                 held: Callable[[Endpoint], int] | None = None,
                 bound: AffinityBound = DEFAULT_AFFINITY_BOUND) -> RouteDecision:
    """`held(endpoint)`: prompt tokens of this request the pod is expected to hold (None: no
    cache affinity, classes by the full length)."""
    if held is not None:
        cls, group, prefill, fallback, cached = _affine_route(tokens, threshold, groups, load, exclude,
                                                               tiebreak, held, bound)
        described = (SHORT, LONG)
    else:
        cls, cached = length_class(tokens, threshold), 0
        group, fallback = cls, False
        prefill = least_loaded(groups.get(cls, ()), load, exclude, tiebreak)
        if prefill is None:
            group, fallback = OTHER[cls], True
            prefill = least_loaded(groups.get(group, ()), load, exclude, tiebreak)
        described = (cls, OTHER[cls])
    if prefill is None:
        raise NoEndpointError(
            f"no usable prefill pod for a {cls} request ({tokens} tokens): "
            + "; ".join(describe(f"prefill-{g}", groups.get(g, ()), load, exclude) for g in described))
    decode_ep = least_loaded(decode, load, exclude, tiebreak)
    if decode_ep is None:
        raise NoEndpointError(f"no usable decode pod: {describe('decode', decode, load, exclude)}")
    return RouteDecision(cls, group, prefill, decode_ep, fallback, cached)

