from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laps_agent.lab.bench.gateway import bench_routing
from laps_agent.policy.classes import length_class as classify
from laps_agent.policy.routing import Endpoint, EndpointLoad, NoEndpointError, choose_route


def ep(name: str) -> Endpoint:
    return Endpoint(name, f"http://{name}:30000", name, 8998)


loads = st.builds(EndpointLoad, pending_requests=st.integers(0, 3), pending_tokens=st.sampled_from([0, 10, 500]),
                  healthy=st.booleans())


@st.composite
def clusters(draw):
    groups = {"short": [ep(f"s{i}") for i in range(draw(st.integers(0, 4)))],
              "long": [ep(f"l{i}") for i in range(draw(st.integers(0, 4)))]}
    decode = [ep(f"d{i}") for i in range(draw(st.integers(0, 3)))]
    everyone = [e.name for g in groups.values() for e in g] + [e.name for e in decode]
    # some pods have no load entry yet (just discovered)
    load = {name: draw(loads) for name in everyone if draw(st.integers(0, 5))}
    exclude = frozenset(draw(st.lists(st.sampled_from(everyone), max_size=3))) if everyone else frozenset()
    return groups, decode, load, exclude


def usable(endpoints, load, exclude):
    return [e for e in endpoints if e.name not in exclude and load.get(e.name, EndpointLoad()).healthy]


def key(e, load):
    state = load.get(e.name, EndpointLoad())
    return state.pending_tokens, state.pending_requests


@settings(deadline=None, max_examples=400)
@given(cluster=clusters(), tokens=st.integers(0, 1000), tiebreak=st.integers(0, 50))
def test_route_is_healthy_in_the_right_group_and_least_loaded(cluster, tokens, tiebreak):
    groups, decode, load, exclude = cluster
    cls = classify(tokens, 256)
    own, other = usable(groups[cls], load, exclude), usable(groups["long" if cls == "short" else "short"], load, exclude)
    decoders = usable(decode, load, exclude)
    if not (own or other) or not decoders:
        with pytest.raises(NoEndpointError, match="prefill" if not (own or other) else "decode"):
            choose_route(tokens, 256, groups, decode, load, exclude, tiebreak)
        return
    decision = choose_route(tokens, 256, groups, decode, load, exclude, tiebreak)
    assert decision.cls == cls
    assert decision.fallback is (not own)
    candidates = own or other
    assert decision.group == (cls if own else ("long" if cls == "short" else "short"))
    assert decision.prefill in candidates
    assert key(decision.prefill, load) == min(key(e, load) for e in candidates)
    assert decision.decode in decoders
    assert key(decision.decode, load) == min(key(e, load) for e in decoders)


def test_equal_pods_take_turns_by_tiebreak():
    groups = {"short": [ep("a"), ep("b"), ep("c")], "long": [ep("x")]}
    chosen = {choose_route(10, 256, groups, [ep("d")], {}, tiebreak=t).prefill.name for t in range(3)}
    assert chosen == {"a", "b", "c"}
    busy = {"a": EndpointLoad(pending_tokens=100), "b": EndpointLoad(pending_tokens=5, pending_requests=2),
            "c": EndpointLoad(pending_tokens=5, pending_requests=1)}
    assert {choose_route(10, 256, groups, [ep("d")], busy, tiebreak=t).prefill.name for t in range(3)} == {"c"}


def test_long_request_falls_back_to_short_group_when_long_pods_are_down():
    groups = {"short": [ep("s0")], "long": [ep("l0"), ep("l1")]}
    load = {"l0": EndpointLoad(healthy=False)}
    decision = choose_route(5000, 256, groups, [ep("d0")], load, exclude={"l1"})
    assert (decision.cls, decision.group, decision.prefill.name, decision.fallback) == ("long", "short", "s0", True)


def test_nothing_usable_names_what_is_missing():
    groups = {"short": [ep("s0")], "long": []}
    with pytest.raises(NoEndpointError, match=r"prefill-short: 1 pods, 1 unhealthy.*prefill-long: no pods"):
        choose_route(10, 256, groups, [ep("d0")], {"s0": EndpointLoad(healthy=False)})
    with pytest.raises(NoEndpointError, match="no usable decode pod: decode: no pods"):
        choose_route(10, 256, groups, [], {})
    with pytest.raises(NoEndpointError, match="1 excluded after failures"):
        choose_route(10, 256, groups, [ep("d0")], {}, exclude={"d0"})


def test_classify_boundary_is_inclusive():
    assert classify(256, 256) == "short" and classify(257, 256) == "long"


def test_bench_routing_reports_a_positive_rate():
    assert bench_routing(200) > 0
