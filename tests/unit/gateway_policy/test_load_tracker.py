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
