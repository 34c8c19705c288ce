"""The predicted-TTFT router (policy/placement.py): work-conserving, the groups a preference,
refusal only when no pod the request may use would prefill it in time."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laps_agent.policy.placement import TIE_SHARE, ArrivalMix, PrefillCost, place, predicted_seconds
from laps_agent.policy.routing import Endpoint, EndpointLoad, NoEndpointError

COST = PrefillCost(0.02, 1e-4)     # about the H200 32B profile: 20 ms a batch, 0.1 ms a token
THRESHOLD = 256


def ep(name: str) -> Endpoint:
    return Endpoint(name, f"http://{name}:30000", name, 8998)


def cluster(short=2, long_=2):
    return {"short": [ep(f"s{i}") for i in range(short)], "long": [ep(f"l{i}") for i in range(long_)]}, [ep("d0")]


def busy(long_tokens=0, long_requests=0, short_tokens=0, short_requests=0) -> EndpointLoad:
    return EndpointLoad(pending_requests=long_requests + short_requests, pending_tokens=long_tokens + short_tokens,
                        short_requests=short_requests, short_tokens=short_tokens)


def put(tokens, loads, groups, decode, **kw):
    kw.setdefault("cost", lambda name: COST)
    return place(tokens, THRESHOLD, groups, decode, loads, **kw)


def test_a_short_request_takes_an_idle_long_group_pod_when_its_own_group_is_busy():
    groups, decode = cluster()
    loads = {"s0": busy(short_tokens=4000, short_requests=20), "s1": busy(short_tokens=4000, short_requests=20)}
    placed = put(100, loads, groups, decode)
    assert placed.route.prefill.name in ("l0", "l1")
    assert placed.route.cls == "short" and placed.route.group == "long"


def test_a_short_request_prefers_its_own_group_when_the_pods_are_equal():
    groups, decode = cluster()
    for tiebreak in range(8):
        assert put(100, {}, groups, decode, tiebreak=tiebreak).route.group == "short"


def test_a_short_request_waits_behind_queued_shorts_not_behind_queued_longs():
    """The dual queue serves a short before the longs queued on its pod: only a long batch that
    may be running counts, so a pod with queued long work can still be the short's best."""
    groups, decode = {"short": [ep("s0")], "long": [ep("l0")]}, [ep("d0")]
    loads = {"s0": busy(short_tokens=6000, short_requests=30), "l0": busy(long_tokens=3000, long_requests=1)}
    with_longs = predicted_seconds(loads["l0"], COST, "short", 100)
    with_shorts = predicted_seconds(loads["s0"], COST, "short", 100)
    assert with_longs < with_shorts
    assert put(100, loads, groups, decode).route.prefill.name == "l0"


def test_a_long_request_waits_behind_everything_queued():
    """... in one batch of the shorts and, at a 4,096-token long budget, two long batches."""
    load = busy(long_tokens=3000, long_requests=1, short_tokens=500, short_requests=5)
    assert predicted_seconds(load, COST, "long", 2000, long_batch_tokens=4096) == pytest.approx(COST.seconds(5500, batches=3))
    assert predicted_seconds(load, COST, "long", 2000, long_batch_tokens=0) == pytest.approx(COST.seconds(5500, batches=2))


def test_a_long_request_stays_in_the_long_group_while_it_is_not_far_behind():
    groups, decode = cluster()
    loads = {"l0": busy(long_tokens=1000, long_requests=1), "l1": busy(long_tokens=1000, long_requests=1)}
    placed = put(3000, loads, groups, decode)
    assert placed.route.group == "long" and placed.route.cls == "long"


def test_a_long_request_spills_to_a_short_pod_only_when_the_long_group_would_hold_it_longer_than_it_runs():
    groups, decode = cluster()
    backed_up = {"l0": busy(long_tokens=40000, long_requests=10), "l1": busy(long_tokens=40000, long_requests=10)}
    placed = put(3000, backed_up, groups, decode)
    assert placed.route.group == "short" and placed.route.cls == "long" and placed.route.fallback


def test_a_long_takes_a_short_pod_whenever_a_short_behind_its_batch_would_still_start_in_time():
    """With shorts around, a long that would not wait in the long group longer than it runs
    stays there, unless its batch on the short-group pod is short enough (0.22 s here, within
    0.6 x the 0.5 s short SLO) that a short arriving behind it would still start in time."""
    groups, decode = cluster(short=1, long_=1)
    loads = {"l0": busy(long_tokens=1000, long_requests=1)}
    slo = {"short": 0.5, "long": 3.0}
    assert put(2000, loads, groups, decode).route.prefill.name == "l0"
    placed = put(2000, loads, groups, decode, ttft_slo_s=slo)
    assert placed.route.prefill.name == "s0" and placed.route.cls == "long"
    # A 4,000-token long runs a 0.42 s batch: a short behind it would be late.
    assert put(4000, loads, groups, decode, ttft_slo_s=slo).route.prefill.name == "l0"


def test_with_no_short_traffic_long_work_uses_the_short_group_as_one_pool():
    """Protection 1 (shorts around): a long stays in its group while it is held back less than it
    runs; protection 0 (none seen lately): it goes wherever it finishes first."""
    groups, decode = cluster()
    queued = {"l0": busy(long_tokens=2000, long_requests=1), "l1": busy(long_tokens=2000, long_requests=1)}
    assert put(3000, queued, groups, decode, protection=1.0).route.group == "long"
    assert put(3000, queued, groups, decode, protection=0.0).route.group == "short"


def test_the_mix_is_the_traffic_seen_so_far_from_its_first_request():
    """A benchmark's prompts are all long: the short group is not kept idle for them; the first
    short request protects it again at once."""
    mix = ArrivalMix()
    assert mix.protection == 1.0     # nothing seen yet
    mix.observe(False)
    assert mix.protection == 0.0
    for _ in range(10):
        mix.observe(False)
    mix.observe(True)
    assert mix.protection == 1.0     # 1 in 12


def test_the_short_group_is_protected_while_a_few_percent_of_requests_are_short():
    mix = ArrivalMix()
    for i in range(400):
        mix.observe(i % 20 == 0)      # 5% short
    assert mix.protection > 0.8
    for _ in range(400):
        mix.observe(False)            # none for a while: one pool
    assert mix.protection < 0.01


def test_of_equal_pods_an_idle_one_is_preferred_to_one_whose_batch_is_nearly_done():
    """Both predict the request's own prefill, but the busy pod's is an estimate."""
    groups, decode = {"short": [ep("s0"), ep("s1")], "long": []}, [ep("d0")]
    loads = {"s0": EndpointLoad(pending_requests=1, pending_tokens=3000, batch_since=0.0)}
    for tiebreak in range(4):
        assert put(3000, loads, groups, decode, tiebreak=tiebreak, now=0.5).route.prefill.name == "s1"


def test_an_idle_pod_of_the_other_group_comes_before_a_busy_one_of_its_own_predicting_the_same():
    """The short-group pod's batch is credited as done (the gateway counts its short until the KV
    is handed off), so it predicts the request's own prefill, as the idle long-group pod does;
    the engine may still be running it: the idle pod serves the short at once."""
    groups, decode = cluster(short=1, long_=1)
    loads = {"s0": EndpointLoad(pending_requests=1, pending_tokens=130, short_requests=1, short_tokens=130,
                                batch_since=0.0)}
    for tiebreak in range(4):
        placed = put(130, loads, groups, decode, tiebreak=tiebreak, now=1.0)
        assert placed.route.prefill.name == "l0" and placed.route.cls == "short"


def test_of_pods_each_running_one_batch_the_request_goes_to_the_one_nearest_its_end():
    """The gateway knows when each pod's running batch began (LoadTracker: its first dispatch
    to the pod idle, else the pod's last prefill's end): the batch that began first ends first."""
    groups, decode = {"short": [ep("s0"), ep("s1"), ep("s2")], "long": []}, [ep("d0")]
    loads = {name: EndpointLoad(pending_requests=1, pending_tokens=3000, batch_since=since)
             for name, since in (("s0", 10.0), ("s1", 9.8), ("s2", 10.1))}
    for tiebreak in range(6):
        assert put(3000, loads, groups, decode, tiebreak=tiebreak, now=10.2).route.prefill.name == "s1"
    # Without the clock (or the start unknown) they are equal: the work is shared.
    assert {put(3000, loads, groups, decode, tiebreak=k).route.prefill.name for k in range(6)} == {"s0", "s1", "s2"}


def test_a_batch_is_credited_at_most_its_own_length():
    running = EndpointLoad(pending_requests=1, pending_tokens=3000, batch_since=0.0)
    own = COST.seconds(2000)
    assert predicted_seconds(running, COST, "long", 2000, elapsed_s=100.0) == pytest.approx(own)


def test_with_no_usable_long_pod_long_work_goes_to_the_short_group():
    groups, decode = cluster()
    loads = {"l0": EndpointLoad(healthy=False)}
    placed = put(3000, loads, groups, decode, exclude=frozenset({"l1"}))
    assert placed.route.group == "short"


def test_a_request_is_refused_only_when_no_pod_it_may_use_would_prefill_it_in_time():
    groups, decode = cluster()
    full = busy(short_tokens=20000, short_requests=80)
    loads = {"s0": full, "s1": full, "l0": full, "l1": busy(long_tokens=100, long_requests=1)}
    # its own group is over the bound, but a long-group pod would serve it in time
    placed = put(100, loads, groups, decode, max_pending_tokens_per_pod=16384)
    assert placed.route is not None and placed.route.prefill.name == "l1"
    loads["l1"] = full
    refused = put(100, loads, groups, decode, max_pending_tokens_per_pod=16384)
    assert refused.route is None and "no prefill pod would prefill this short request in time" in refused.refusal


def test_an_idle_pod_always_takes_a_request_however_large():
    groups, decode = cluster(1, 1)
    placed = put(60000, {}, groups, decode, max_pending_tokens_per_pod=16384)
    assert placed.route is not None


def test_the_watermark_is_counted_in_the_pods_own_batches():
    """A pod that prefills at most 512 tokens a batch pays its batch overhead per 512 tokens: 3,100
    tokens ahead under a 4,096-token watermark are within it at that pod's speed (counted in
    16,384-token batches, the watermark's seconds were too few and the pod refused them)."""
    groups, decode = {"short": [ep("s0")], "long": []}, [ep("d0")]
    loads = {"s0": busy(short_tokens=3000, short_requests=30)}
    placed = put(100, loads, groups, decode, max_pending_tokens_per_pod=4096, batch_tokens=lambda name: 512)
    assert placed.route is not None
    assert put(1100, loads, groups, decode, max_pending_tokens_per_pod=4096, batch_tokens=lambda name: 512).route is None


def test_a_short_request_waits_behind_the_long_batch_its_pod_reports_it_runs():
    """A pod that caps its long batches at 4,096 tokens (max_long_batch_tokens, in its load
    report) runs three 3,000-token longs one at a time: a short waits for one of them there, not
    for all three, and so goes there rather than behind a 7,000-token long elsewhere."""
    groups, decode = {"short": [ep("s0")], "long": [ep("l0")]}, [ep("d0")]
    loads = {"s0": busy(long_tokens=7000, long_requests=1), "l0": busy(long_tokens=9000, long_requests=3)}
    whole = put(100, loads, groups, decode, long_batch_tokens=lambda name: 0)   # l0 runs all three at once
    assert whole.route.prefill.name == "s0"
    capped = put(100, loads, groups, decode, long_batch_tokens=lambda name: 4096 if name == "l0" else 0)
    assert capped.route.prefill.name == "l0"
    assert capped.predicted_s == pytest.approx(COST.seconds(3000) + COST.seconds(100))


def test_a_long_request_is_bounded_by_the_watermark_in_the_pods_long_batches():
    """Long work on a pod capping long batches at 4,096 tokens is prefilled in 4,096-token
    batches, each paying its overhead: the watermark's seconds count them (counted as one
    16,384-token batch, a long within the watermark's tokens was refused)."""
    groups, decode = {"short": [], "long": [ep("l0")]}, [ep("d0")]
    loads = {"l0": busy(long_tokens=12000, long_requests=3)}
    kw = dict(max_pending_tokens_per_pod=16384, long_batch_tokens=lambda name: 4096)
    assert put(4300, loads, groups, decode, **kw).route is not None
    assert put(4500, loads, groups, decode, **kw).route is None


def test_a_long_its_group_refuses_goes_to_a_short_pod_already_holding_long_work_first():
    """A short at a pod waits for the long batch under way there, however many longs queue: a
    long that every long-group pod refuses joins a short-group pod already holding long work
    first; failing one, any short-group pod that takes it, rather than a 429 while that pod
    could serve it (a long prompt of a RAG-like mix, 70% long, was refused while the short pods
    idled: docs/design/placement.md); and 429 only when no pod takes it."""
    groups, decode = {"short": [ep("s0"), ep("s1")], "long": [ep("l0")]}, [ep("d0")]
    loads = {"l0": busy(long_tokens=13000, long_requests=4), "s0": busy(long_tokens=12000, long_requests=4),
             "s1": busy(short_tokens=12000, short_requests=40)}
    kw = dict(max_pending_tokens_per_pod=16384, long_batch_tokens=lambda name: 4096)
    assert put(4000, loads, groups, decode, **kw).route.prefill.name == "s0"
    only_shorts = {"short": [ep("s1")], "long": [ep("l0")]}
    assert put(4000, loads, only_shorts, decode, **kw).route.prefill.name == "s1"
    full = {**loads, "s1": busy(short_tokens=16000, short_requests=50)}
    refused = put(4000, full, only_shorts, decode, **kw)
    assert refused.route is None and "l0" in refused.refusal


def test_the_pods_measured_in_time_capacity_bounds_it():
    groups, decode = {"short": [ep("s0")], "long": []}, [ep("d0")]
    loads = {"s0": busy(short_tokens=200, short_requests=2)}
    assert put(100, loads, groups, decode, max_pending_tokens_per_pod=16384,
               capacity=lambda name: 250).route is None
    assert put(100, loads, groups, decode, max_pending_tokens_per_pod=16384,
               capacity=lambda name: 400).route is not None


def test_a_conversation_goes_back_to_the_pod_holding_its_prefix_and_counts_as_short_there():
    groups, decode = cluster()
    held = {"l1": 3900}
    placed = put(4000, {}, groups, decode, held=lambda e: held.get(e.name, 0))
    assert placed.route.prefill.name == "l1" and placed.route.cls == "short" and placed.route.cached == 3900


def test_a_pod_holding_the_prefix_is_left_when_it_is_slower_for_it():
    groups, decode = cluster()
    held = {"s0": 200}
    loads = {"s0": busy(short_tokens=30000, short_requests=100)}
    placed = put(300, loads, groups, decode, held=lambda e: held.get(e.name, 0))
    assert placed.route.prefill.name != "s0" and placed.route.cached == 0


def test_a_class_over_its_decode_share_is_refused_with_the_reason():
    groups, decode = cluster()
    refused = put(100, {}, groups, decode, decode_held=lambda cls: 96 if cls == "short" else 0, decode_slots=128,
                  max_decode_share=0.75)
    assert refused.route is None and "short class is overloaded in the decode pool" in refused.refusal
    assert put(3000, {}, groups, decode, decode_held=lambda cls: 96 if cls == "short" else 0, decode_slots=128,
               max_decode_share=0.75).route is not None


def test_no_usable_pod_names_the_groups():
    groups, decode = cluster()
    with pytest.raises(NoEndpointError, match="prefill-short: 2 pods, 2 excluded after failures; prefill-long: 2 pods"):
        put(100, {}, groups, decode, exclude=frozenset({"s0", "s1", "l0", "l1"}))


def test_equal_pods_share_the_work_though_their_measured_costs_differ_by_noise():
    groups, decode = {"short": [ep("s0"), ep("s1"), ep("s2")], "long": []}, [ep("d0")]
    costs = {"s0": PrefillCost(0.02, 1.000e-4), "s1": PrefillCost(0.02, 1.004e-4), "s2": PrefillCost(0.0201, 1e-4)}
    chosen = {put(3000, {}, groups, decode, cost=costs.get, tiebreak=k).route.prefill.name for k in range(6)}
    assert chosen == {"s0", "s1", "s2"}


def test_a_pod_that_measured_a_little_faster_does_not_draw_shorts_from_idle_pods():
    """Pods of one hardware whose fits differ by noise (here 15%) predict with their mean: a busy
    pod whose running batch the gateway credits as done ties with the idle pods, and the idle one
    wins the tie (it was predicted faster by its own fit and took the short, 0.1 s late, in the 72B
    matrix); a pod twice as fast (other hardware) keeps its own cost."""
    groups, decode = {"short": [ep("s0"), ep("s1")], "long": []}, [ep("d0")]
    costs = {"s0": PrefillCost(0.023, 1e-4), "s1": PrefillCost(0.027, 1.15e-4)}
    loads = {"s0": EndpointLoad(pending_requests=2, pending_tokens=300, short_requests=2, short_tokens=300,
                                batch_since=0.0)}
    for tiebreak in range(4):
        assert put(100, loads, groups, decode, cost=costs.get, tiebreak=tiebreak, now=0.2).route.prefill.name == "s1"
    faster = {"s0": PrefillCost(0.010, 0.5e-4), "s1": PrefillCost(0.027, 1.15e-4)}
    assert put(100, loads, groups, decode, cost=faster.get, now=0.2).route.prefill.name == "s0"


def test_before_any_cost_is_measured_pods_rank_by_their_pending_tokens():
    groups, decode = {"short": [ep("s0"), ep("s1")], "long": []}, [ep("d0")]
    loads = {"s0": busy(short_tokens=300, short_requests=1), "s1": busy(short_tokens=100, short_requests=1)}
    assert put(100, loads, groups, decode, cost=lambda name: None).route.prefill.name == "s1"


@st.composite
def loads(draw):
    """A pod's load as the gateway books it: tokens pending only with requests pending."""
    long_requests, short_requests = draw(st.integers(0, 4)), draw(st.integers(0, 10))
    return busy(long_tokens=long_requests * draw(st.sampled_from([300, 2000, 6000])), long_requests=long_requests,
                short_tokens=short_requests * draw(st.integers(1, THRESHOLD)), short_requests=short_requests)


@settings(max_examples=200, deadline=None)
@given(tokens=st.integers(1, 9000), s=st.lists(loads(), min_size=1, max_size=4),
       l_=st.lists(loads(), min_size=0, max_size=4))
def test_a_short_request_goes_where_it_is_predicted_to_start_first(tokens, s, l_):
    """Work-conserving: no usable pod predicts an earlier first token for a short than the one
    it is sent to, but for equals (within TIE_SHARE, where the groups decide); for any request,
    an idle pod is never passed over for a busier one of the same group."""
    groups = {"short": [ep(f"s{i}") for i in range(len(s))], "long": [ep(f"l{i}") for i in range(len(l_))]}
    load = {**{f"s{i}": x for i, x in enumerate(s)}, **{f"l{i}": x for i, x in enumerate(l_)}}
    placed = put(tokens, load, groups, [ep("d0")])
    chosen = placed.route.prefill.name
    if placed.route.cls == "short":
        best = min(predicted_seconds(x, COST, "short", tokens) for x in load.values())
        assert best <= placed.predicted_s <= best * (1 + TIE_SHARE) + 1e-12
    group = [e.name for e in groups[placed.route.group]]
    if load[chosen].pending_tokens:
        assert all(load[name].pending_tokens for name in group)
