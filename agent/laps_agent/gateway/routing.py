"""Pure routing policy of the gateway: class by length, least-loaded prefill and decode pods.

Order of preference for the prefill pod: the group of the request's class ("short" | "long");
within it the pod with the fewest pending tokens, then fewest pending requests, then a rotation
by `tiebreak` among the pods still tied (so equal pods share the load deterministically).
Unhealthy and excluded pods are skipped. If the class's group has no usable pod, the other
group serves it and the decision says fallback=True. The decode pod is chosen the same way
from the decode list. This runs once per request, so it allocates nothing per endpoint.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import AbstractSet, Mapping, Sequence

from laps_agent.scheduling.classes import LONG, SHORT, length_class

_OTHER = {SHORT: LONG, LONG: SHORT}


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


@dataclass(frozen=True, slots=True)
class RouteDecision:
    cls: str            # the request's class: "short" | "long"
    group: str          # the group that serves it (differs from cls on fallback)
    prefill: Endpoint
    decode: Endpoint
    fallback: bool


class NoEndpointError(Exception):
    """No usable endpoint; the message names what is missing."""


_UNKNOWN = EndpointLoad()   # a pod the load tracker has not seen yet: healthy and idle


def _least_loaded(endpoints: Sequence[Endpoint], load: Mapping[str, EndpointLoad],
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


def _describe(name: str, endpoints: Sequence[Endpoint], load: Mapping[str, EndpointLoad],
              exclude: AbstractSet[str]) -> str:
    if not endpoints:
        return f"{name}: no pods"
    excluded = sum(1 for ep in endpoints if ep.name in exclude)
    unhealthy = sum(1 for ep in endpoints if ep.name not in exclude and not load.get(ep.name, _UNKNOWN).healthy)
    parts = [f"{unhealthy} unhealthy"] if unhealthy else []
    if excluded:
        parts.append(f"{excluded} excluded after failures")
    return f"{name}: {len(endpoints)} pods, " + ", ".join(parts)


def choose_route(tokens: int, threshold: int, groups: Mapping[str, Sequence[Endpoint]],
                 decode: Sequence[Endpoint], load: Mapping[str, EndpointLoad],
                 exclude: AbstractSet[str] = frozenset(), tiebreak: int = 0) -> RouteDecision:
    cls = length_class(tokens, threshold)
    group, fallback = cls, False
    prefill = _least_loaded(groups.get(cls, ()), load, exclude, tiebreak)
    if prefill is None:
        group, fallback = _OTHER[cls], True
        prefill = _least_loaded(groups.get(group, ()), load, exclude, tiebreak)
        if prefill is None:
            raise NoEndpointError(
                f"no usable prefill pod for a {cls} request ({tokens} tokens): "
                f"{_describe('prefill-' + cls, groups.get(cls, ()), load, exclude)}; "
                f"{_describe('prefill-' + group, groups.get(group, ()), load, exclude)}")
    decode_ep = _least_loaded(decode, load, exclude, tiebreak)
    if decode_ep is None:
        raise NoEndpointError(f"no usable decode pod: {_describe('decode', decode, load, exclude)}")
    return RouteDecision(cls, group, prefill, decode_ep, fallback)


def bench_routing(n: int = 200_000) -> float:
    """Routing decisions per second, in-process, for 3 short + 3 long prefill pods and 2 decode
    pods with changing loads (what the gateway does once per request)."""
    def ep(name: str) -> Endpoint:
        return Endpoint(name, f"http://{name}:30000", name, 8998)

    groups = {SHORT: [ep(f"ps{i}") for i in range(3)], LONG: [ep(f"pl{i}") for i in range(3)]}
    decode = [ep(f"d{i}") for i in range(2)]
    names = [e.name for g in groups.values() for e in g] + [e.name for e in decode]
    load = {name: EndpointLoad() for name in names}
    states = list(load.values())
    exclude: frozenset[str] = frozenset()
    start = time.perf_counter()
    for i in range(n):
        state = states[i % len(states)]
        state.pending_tokens = (i * 7919) % 4096   # loads move between decisions
        state.pending_requests = i % 5
        choose_route((i * 37) % 600, 256, groups, decode, load, exclude, i)
    elapsed = time.perf_counter() - start
    return n / elapsed if elapsed > 0 else float("inf")


if __name__ == "__main__":
    print(f"{bench_routing():,.0f} routing decisions/s")
