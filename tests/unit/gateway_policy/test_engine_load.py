"""Engine-reported load merged with the gateway's own dispatches (what routing sees)."""
from __future__ import annotations

import pytest

from laps_agent.gateway.proxy.engine_load import EngineLoads, LoadReport, parse_report
from laps_agent.policy.admission import decode_held, group_load
from laps_agent.policy.routing import Endpoint, EndpointLoad, choose_route


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


def ep(name: str) -> Endpoint:
    return Endpoint(name, f"http://{name}:30000", name, 8998)


def test_without_reports_routing_sees_the_gateways_own_loads(clock):
    own = {"a": EndpointLoad(1, 100)}
    assert EngineLoads(0.1, clock).merged(own) is own


IDLE = EndpointLoad()


def test_an_engines_report_counts_work_other_gateways_sent(clock):
    loads = EngineLoads(0.1, clock)
    mark = loads.asking("a", EndpointLoad(1, 100))       # this gateway had 1 request there
    loads.answered("a", mark, requests=3, tokens=3000)
    merged = loads.merged({"a": EndpointLoad(1, 100), "b": EndpointLoad()})
    assert (merged["a"].pending_requests, merged["a"].pending_tokens) == (3, 3000)
    assert merged["b"] == EndpointLoad()
    # ... so a second gateway over the same pods picks the one the first gateway loaded last
    d = choose_route(10, 256, {"short": [ep("a"), ep("b")]}, [ep("d")], merged)
    assert d.prefill.name == "b"


def test_own_work_counts_as_of_now_and_others_as_of_the_last_answer(clock):
    loads = EngineLoads(0.1, clock)
    mark = loads.asking("a", EndpointLoad(1, 500))        # the answer includes this gateway's 500
    loads.answered("a", mark, requests=3, tokens=2500)   # ... and 2000 of other replicas
    assert loads.merged({"a": EndpointLoad(2, 700)})["a"].pending_tokens == 2700  # a burst since: spread
    assert loads.merged({"a": EndpointLoad(3, 1000)})["a"].pending_tokens == 3000
    # This gateway's requests finished: they stop counting at once (no wait for the next poll),
    # while the other replicas' work stays what the engine last said.
    assert loads.merged({"a": EndpointLoad(0, 0)})["a"].pending_tokens == 2000


def test_a_single_gateway_sees_its_own_load_drain_at_once(clock):
    """With no other replica the engine only reports this gateway's work: once that finished,
    the pod is idle for routing and admission, even before the next poll."""
    loads = EngineLoads(0.1, clock)
    loads.answered("a", loads.asking("a", EndpointLoad(3, 3000)), requests=3, tokens=2800)
    assert loads.merged({"a": EndpointLoad(0, 0)})["a"] == EndpointLoad(0, 0)


def test_own_pending_work_is_a_floor_and_health_stays_the_gateways(clock):
    loads = EngineLoads(0.1, clock)
    loads.answered("a", loads.asking("a", IDLE), requests=0, tokens=0)  # engine has not seen it yet
    merged = loads.merged({"a": EndpointLoad(2, 900, healthy=False)})
    assert merged["a"] == EndpointLoad(2, 900, healthy=False)


def test_stale_or_late_answers_are_ignored(clock):
    loads = EngineLoads(0.1, clock)
    old = loads.asking("a", IDLE)
    clock.now += 0.1
    new = loads.asking("a", IDLE)
    loads.answered("a", new, requests=1, tokens=10)
    loads.answered("a", old, requests=9, tokens=9000)      # arrived after a later poll's answer
    assert loads.report("a")["tokens"] == 10
    clock.now += loads.stale_after_s + 0.01                # the engine stopped answering
    assert loads.report("a") is None
    assert loads.merged({"a": EndpointLoad(1, 5)})["a"].pending_tokens == 5


def test_pods_that_left_are_forgotten(clock):
    loads = EngineLoads(0.1, clock)
    loads.answered("a", loads.asking("a", IDLE), requests=1, tokens=10)
    loads.keep_only(["b"])
    assert loads.report("a") is None and loads.merged({}) == {}


def test_admission_counts_the_groups_reported_load_or_its_own_if_more():
    members = [ep("a"), ep("b")]
    loads = {"a": EndpointLoad(2, 9000), "b": EndpointLoad(0, 0, healthy=False)}
    assert group_load(members, loads, own_pending_tokens=100) == (1, 9000)
    assert group_load(members, loads, own_pending_tokens=12000) == (1, 12000)


def test_a_report_is_read_from_get_load_json():
    body = (b'{"role": "decode", "waiting_requests": 1, "pending_tokens": 20, '
            b'"running_requests": 3, "transfer_requests": 2}')
    assert parse_report(body) == LoadReport(6, 20, None, None)   # an older engine's: still valid
    # A decode engine also says how many requests it decodes at once (the decode share's base)
    # and how many each class holds there (every gateway replica's).
    assert parse_report(body[:-1] + b', "max_running_requests": 48}') == LoadReport(6, 20, 48, None)
    assert parse_report(body[:-1] + b', "held_by_class": {"short": 1, "long": 5}}') == LoadReport(
        6, 20, None, {"short": 1, "long": 5})
    # A prefill engine says what it prefills in time (admission.in_time bounds its queue by it).
    assert parse_report(body[:-1] + b', "max_pending_tokens": 5000}').capacity == 5000
    for bad in (b'{"detail": "Not Found"}', b"[]", b"not json", b'{"waiting_requests": "x", "pending_tokens": 1}',
                body[:-1] + b', "held_by_class": [1, 2]}', body[:-1] + b', "held_by_class": {"long": "x"}}',
                # JSON reads 1e400 as infinity, which int() refuses with an OverflowError: that
                # escaped the poller's handler and ended its task for the rest of the process.
                body[:-1] + b', "max_pending_tokens": 1e400}'):
        with pytest.raises(ValueError):
            parse_report(bad)


def test_a_report_is_read_from_sglangs_v1_loads_summed_over_its_ranks():
    """Stock SGLang (the sglang backend) has no /get_load; its /v1/loads?include=core gives the
    same figures per data-parallel rank (its LoadSnapshot's core fields; tests/sglang reads a
    real one through the gateway)."""
    rank = ('{{"timestamp": 1.0, "dp_rank": {r}, "num_running_reqs": {run}, "num_waiting_reqs": {wait}, '
            '"num_waiting_uncached_tokens": {tok}, "num_used_tokens": 900, "num_total_tokens": 950, '
            '"max_total_num_tokens": 16384, "max_running_requests": 32, "token_usage": 0.05}}')
    body = ('{"timestamp": "2026-11-23T10:00:00+00:00", "version": "0.5.23", "accelerator": null, '
            '"num_accelerators": 1, "loads": [' + rank.format(r=0, run=2, wait=3, tok=700) + ", "
            + rank.format(r=1, run=1, wait=0, tok=0) + "]}").encode()
    assert parse_report(body) == LoadReport(6, 700, 64, None)   # no classes: each gateway counts its own
    with pytest.raises(ValueError):
        parse_report(b'{"loads": [{"dp_rank": 0}]}')


# ---- the decode share over several gateway replicas: per class, own + the others' held --------

DECODE = [ep("d1"), ep("d2")]


def test_a_class_counts_the_requests_other_replicas_hold_on_the_decode_pods(clock):
    loads = EngineLoads(0.1, clock)
    # d1 holds 2 long requests of this gateway's and 3 of another replica's; d2 one of its.
    mark = loads.asking("d1", IDLE, {"long": (2, 7)})
    loads.answered("d1", mark, 5, 0, 8, {"short": 0, "long": 5}, own_held={"long": (2, 7)})
    loads.answered("d2", loads.asking("d2", IDLE), 1, 0, 8, {"short": 0, "long": 1})
    assert (loads.others_held("d1", "long"), loads.others_held("d2", "long")) == (3, 1)
    assert decode_held(DECODE, {}, "long", 2, loads.others_held) == 6
    assert decode_held(DECODE, {}, "short", 0, loads.others_held) == 0
    # This gateway's own count is as of now: its requests that ended stop counting at once.
    assert decode_held(DECODE, {}, "long", 0, loads.others_held) == 4
    # A pod out of the pool (ejected here) adds neither slots nor held requests.
    assert decode_held(DECODE, {"d2": EndpointLoad(healthy=False)}, "long", 2, loads.others_held) == 5


def test_requests_sent_while_a_poll_is_answered_are_not_taken_for_another_replicas(clock):
    """A request dispatched between the poll and its answer may already be in the answer: were
    it counted as another replica's, a lone gateway at its share would refuse the next request."""
    loads = EngineLoads(0.1, clock)
    mark = loads.asking("d1", IDLE, {"long": (1, 1)})
    # two more long requests sent meanwhile (one of them already ended), both in the answer
    loads.answered("d1", mark, 3, 0, 4, {"short": 0, "long": 3}, own_held={"long": (2, 3)})
    assert loads.others_held("d1", "long") == 0
    # A class this gateway had never sent there before the poll counts the same way.
    mark = loads.asking("d1", IDLE, {"long": (2, 3)})
    loads.answered("d1", mark, 4, 0, 4, {"short": 1, "long": 2}, own_held={"long": (2, 3), "short": (1, 1)})
    assert (loads.others_held("d1", "short"), loads.others_held("d1", "long")) == (0, 0)


def test_without_classes_in_the_reports_a_class_counts_this_gateways_own_alone(clock):
    """SGLang's /v1/loads (and older engines) report no classes; a stale answer counts none."""
    loads = EngineLoads(0.1, clock)
    loads.answered("d1", loads.asking("d1", IDLE), *parse_report(
        b'{"waiting_requests": 0, "pending_tokens": 0, "running_requests": 9, "max_running_requests": 8}'))
    loads.answered("d2", loads.asking("d2", IDLE), 4, 0, 8, {"long": 4})
    assert decode_held(DECODE, {}, "long", 1, loads.others_held) == 5
    assert loads.report("d2")["held_by_class"] == {"long": 4} and "held_by_class" not in loads.report("d1")
    clock.now += loads.stale_after_s + 0.01
    assert decode_held(DECODE, {}, "long", 1, loads.others_held) == 1


def test_a_pods_measured_capacity_counts_only_while_its_reports_are_fresh(clock):
    """A measurement that follows the traffic (unlike a pod's slots): once the pod stops
    answering, its queue is bounded by the token setting alone, not by an old speed."""
    loads = EngineLoads(0.1, clock)
    assert loads.capacity("a") is None                      # never asked
    loads.answered("a", loads.asking("a", IDLE), requests=0, tokens=0, capacity=5000)
    assert loads.capacity("a") == 5000 and loads.report("a")["max_pending_tokens"] == 5000
    clock.now += loads.stale_after_s + 1
    assert loads.capacity("a") is None
    loads.answered("a", loads.asking("a", IDLE), requests=0, tokens=0)   # an engine without it
    assert loads.capacity("a") is None


def test_a_prefill_report_gives_the_cost_the_queued_shorts_and_the_batch_sizes_placement_predicts_with():
    from laps_agent.policy.placement import PrefillCost

    body = (b'{"role": "prefill", "waiting_requests": 6, "pending_tokens": 2000, "prefill_cost": '
            b'{"overhead_s": 0.017, "per_token_s": 0.0001}, "short_pending": [4, 300], "max_prefill_tokens": 8192, '
            b'"max_long_batch_tokens": 4096}')
    report = parse_report(body)
    assert (report.cost, report.short, report.batch_tokens, report.long_batch_tokens) == (
        PrefillCost(0.017, 0.0001), (4, 300), 8192, 4096)
    loads = EngineLoads(0.25, clock=lambda: 0.0)
    mark = loads.asking("p", EndpointLoad())
    loads.answered("p", mark, *report)
    assert (loads.cost("p"), loads.batch_tokens("p"), loads.long_batch_tokens("p")) == (
        PrefillCost(0.017, 0.0001), 8192, 4096)
    # 0 is a budget (its whole batch), not a missing figure; an older engine reports none
    assert parse_report(body.replace(b'"max_long_batch_tokens": 4096', b'"max_long_batch_tokens": 0')).long_batch_tokens == 0
    assert parse_report(body.replace(b', "max_long_batch_tokens": 4096', b'')).long_batch_tokens is None
    with pytest.raises(ValueError, match="max_long_batch_tokens"):
        parse_report(body.replace(b'"max_long_batch_tokens": 4096', b'"max_long_batch_tokens": -1'))
    merged = loads.merged({})["p"]   # another replica's work, its shorts apart
    assert (merged.pending_tokens, merged.short_requests, merged.short_tokens) == (2000, 4, 300)
    with pytest.raises(ValueError, match="not a prefill cost"):
        parse_report(body.replace(b"0.017", b"-1"))
