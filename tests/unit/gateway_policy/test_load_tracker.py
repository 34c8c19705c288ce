"""What the gateway's load tracker tells the router about a prefill pod's running batch: when it
began (EndpointLoad.batch_since), from the gateway's own dispatches and prefill ends."""
from __future__ import annotations

from laps_agent.gateway.config import ProxyConfig
from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.proxy.load import LoadTracker


def test_a_pod_s_batch_begins_at_its_first_dispatch_and_again_at_each_prefill_end():
    clock = [5.0]
    tracker = LoadTracker(GatewayMetrics(), ProxyConfig(), clock=lambda: clock[0])
    first = tracker.begin_prefill("long", "p0", 3000, "long")
    assert tracker.loads()["p0"].batch_since == 5.0
    clock[0] = 5.1
    second = tracker.begin_prefill("long", "p0", 3000, "long")   # queued behind: the batch is the first's
    assert tracker.loads()["p0"].batch_since == 5.0
    clock[0] = 5.4
    first.done()                                                 # the next batch starts as it ends
    assert tracker.loads()["p0"].batch_since == 5.4
    clock[0] = 5.7
    second.done()
    assert tracker.loads()["p0"].batch_since is None             # idle: nothing running


def test_the_decode_share_counts_a_queued_request_once_its_prefill_is_due_within_its_class_s_decode_time():
    """Admission rule 3 as the tracker counts it: before any answer of a class has ended every
    request counts from dispatch (a flood of long answers is bounded from its first request);
    after, one still queued for a prefill predicted to end later than the class's answers
    lately held a decode slot counts only from when it is that close (it would reach the decode
    pool after today's holders left it); from its hand-off to its end it counts."""
    clock = [0.0]
    tracker = LoadTracker(GatewayMetrics(), ProxyConfig(), clock=lambda: clock[0])
    first = tracker.begin_decode("d0", "long", prefill_end_at=0.2)
    queued = tracker.begin_decode("d0", "long", prefill_end_at=3.0)
    assert tracker.decode_share_held("long") == 2 == tracker.decode_held("long")   # no residence yet
    clock[0] = 0.2
    tracker.hand_off(first)
    clock[0] = 1.2
    tracker.end_decode("d0", first)                 # its answer held the slot for 1 s
    assert (tracker.decode_held("long"), tracker.decode_share_held("long")) == (1, 0)
    clock[0] = 2.1
    assert tracker.decode_share_held("long") == 1           # 0.9 s from its predicted prefill end
    unpredicted = tracker.begin_decode("d0", "long")        # no prediction: counted at once
    assert tracker.decode_share_held("long") == 2 and tracker.decode_share_held("short") == 0
    tracker.end_decode("d0", unpredicted)
    tracker.end_decode("d0", queued)                # failed before its hand-off: no residence
    assert tracker.decode_share_held("long") == 0
