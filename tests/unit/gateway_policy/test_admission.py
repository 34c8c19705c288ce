"""Admission control per prefill group: a watermark on pending prompt tokens, proportional to
the group's routable pods; 0 turns it off. Per prefill pod, by its measured capacity: the
request must fit with what the pod holds."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from laps_agent.policy.admission import (
    admit,
    decode_share_bound,
    decode_slots,
    group_bound,
    in_time,
    in_time_route,
    refusal,
)
from laps_agent.policy.routing import Endpoint, EndpointLoad, RouteDecision


def test_a_group_below_its_bound_admits_and_at_it_refuses():
    assert admit(pending_tokens=999, pods=1, max_pending_tokens_per_pod=1000).admitted
    refused = admit(pending_tokens=1000, pods=1, max_pending_tokens_per_pod=1000)
    assert not refused.admitted
    assert (refused.pending_tokens, refused.bound) == (1000, 1000)


def test_the_bound_grows_with_the_group_s_pods():
    assert group_bound(1000, 3) == 3000
    assert admit(2500, 3, 1000).admitted and not admit(2500, 2, 1000).admitted


def test_a_group_without_routable_pods_still_has_one_pod_s_worth():
    # Its class falls back to the other group, whose own bound then applies; the empty group's
    # bound must not be 0 (that would refuse everything while it is being refilled).
    assert group_bound(1000, 0) == 1000


def test_an_idle_group_admits_a_prompt_larger_than_its_bound():
    assert admit(pending_tokens=0, pods=1, max_pending_tokens_per_pod=10).admitted


def test_zero_disables_admission_control():
    verdict = admit(pending_tokens=10**9, pods=1, max_pending_tokens_per_pod=0)
    assert verdict.admitted and verdict.bound is None
    assert group_bound(-5, 4) is None


@given(pending=st.integers(0, 10**6), pods=st.integers(0, 16), per_pod=st.integers(0, 10**5))
def test_admitted_exactly_while_below_the_bound(pending, pods, per_pod):
    verdict = admit(pending, pods, per_pod)
    if per_pod == 0:
        assert verdict.admitted
    else:
        assert verdict.admitted == (pending < per_pod * max(pods, 1))


# ---- the decode share: a class may hold at most a share of the decode pool's slots ----------

def _routed(cls: str) -> RouteDecision:
    ep = Endpoint("p", "http://p", "p", 1)
    return RouteDecision(cls, cls, ep, Endpoint("d", "http://d", "d", None), False)


def test_the_decode_share_is_a_share_of_the_routable_decode_pods_reported_slots():
    pods = [Endpoint(n, f"http://{n}", n, None) for n in ("a", "b", "c")]
    loads = {"c": EndpointLoad(healthy=False)}
    reported = {"a": 8, "c": 8}.get                       # b has not reported yet; c is ejected
    assert decode_slots(pods, loads, reported) == 8
    assert decode_share_bound(0.75, 8) == 6
    assert decode_share_bound(0.75, 1) == 1               # a tiny pool still serves each class
    assert decode_share_bound(0.0, 8) is None and decode_share_bound(0.75, 0) is None


def test_a_class_at_its_decode_share_is_refused_while_the_other_is_admitted():
    group = (1, 0)                                        # an idle prefill group
    refused = refusal(_routed("long"), group, held=6, slots=8, max_pending_tokens_per_pod=1000,
                      max_decode_share=0.75)
    assert refused.startswith("the long class is overloaded in the decode pool: it holds 6 "
                              "requests, its share is 6 (0.75 of 8 decode slots)"), refused
    assert refusal(_routed("short"), group, held=0, slots=8, max_pending_tokens_per_pod=1000,
                   max_decode_share=0.75) is None
    # Slots unknown (no reports) or the share off: no decode bound.
    assert refusal(_routed("long"), group, 60, 0, 1000, 0.75) is None
    assert refusal(_routed("long"), group, 60, 8, 1000, 0.0) is None
    # The prefill group's bound is checked too, and named.
    assert refusal(_routed("long"), (1, 1000), 0, 8, 1000, 0.75).startswith(
        "the long prefill group is overloaded: 1000 prompt tokens pending")


def test_a_pod_takes_a_request_only_if_it_fits_with_what_it_holds_in_its_measured_capacity():
    assert in_time(pending_tokens=2000, work=1000, capacity=3000)
    assert not in_time(pending_tokens=2001, work=1000, capacity=3000)
    assert in_time(pending_tokens=0, work=10_000, capacity=3000)    # idle: a longer prompt still runs
    assert in_time(pending_tokens=10**6, work=1, capacity=None)     # not measured: the group bound alone
    refused = refusal(_routed("long"), (1, 2500), 0, 8, 16384, 0.75, pod=(2500, 1000, 3000))
    assert refused.startswith("the long prefill group is overloaded: its pod p holds 2500 prompt tokens, "
                              "and with this request's 1000 more it would not prefill them within half "
                              "its KV hand-off timeout at its measured speed (about 3000 tokens)"), refused
    assert refusal(_routed("long"), (1, 2000), 0, 8, 16384, 0.75, pod=(2000, 1000, 3000)) is None
    # Admission off (0): the measured bound is off too, as a benchmark of an unbounded queue needs.
    assert refusal(_routed("long"), (1, 2500), 0, 8, 0, 0.75, pod=(2500, 1000, 3000)) is None


def test_a_request_its_pod_would_not_prefill_in_time_goes_to_one_of_its_group_that_would():
    """Routing chose pod a (cache affinity: 500 of the 2,000 tokens held there), whose queue of
    2,500 and the request's 1,500 pass its measured 3,750: the least loaded pod that would take
    all 2,000 in time serves it, and only a group with none refuses."""
    a, b, c, gone = (Endpoint(n, f"http://{n}", n, 1) for n in ("a", "b", "c", "gone"))
    d = RouteDecision("long", "long", a, Endpoint("d", "http://d", "d", None), False, cached=500)
    loads = {"a": EndpointLoad(1, 2500), "b": EndpointLoad(1, 1000), "c": EndpointLoad(1, 900),
             "gone": EndpointLoad(0, 0, healthy=False)}
    capacity = {"a": 3750, "b": 3000, "c": 2500, "gone": 10**6}.get
    moved, pod = in_time_route(d, 2000, [a, b, c, gone], loads, capacity, 16384)
    assert (moved.prefill, moved.cached, moved.group) == (b, 0, "long")   # c is less loaded, but 900 + 2,000 > 2,500
    assert pod == (1000, 2000, 3000)                                      # b's queue, the whole prompt, b's figure
    assert in_time_route(d, 1750, [a, b, c], loads, capacity, 16384)[0] is d   # a takes 1,250 more in time
    nowhere = {**loads, "b": EndpointLoad(2, 2000)}
    assert in_time_route(d, 2000, [a, b, c], nowhere, capacity, 16384) == (d, (2500, 1500, 3750))  # refusal says so
    assert in_time_route(d, 2000, [a, b, c], loads, capacity, 0)[0] is d         # admission off
