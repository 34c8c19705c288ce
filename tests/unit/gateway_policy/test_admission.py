"""Admission control per prefill group: a watermark on pending prompt tokens, proportional to
the group's routable pods; 0 turns it off."""
from __future__ import annotations

from hypothesis import given, strategies as st

from laps_agent.gateway.admission import admit, group_bound


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
