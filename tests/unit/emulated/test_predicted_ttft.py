"""The gateway's prediction of when a request's prefill ends (policy/placement.py) against the
emulated engine's own timing of the same queue (the H200 32B profile, calibrated at start-up as
`laps engine` is): the router is only as good as this agreement."""
from __future__ import annotations

import pytest

from laps_agent.emulated.core import EngineModel
from laps_agent.emulated.prefill_cost import calibrate
from laps_agent.emulated.profile import load_profile
from laps_agent.emulated.requests import ModelRequest
from laps_agent.policy.classes import SHORT, length_class
from laps_agent.policy.placement import PrefillCost, predicted_seconds
from laps_agent.policy.routing import EndpointLoad
from laps_agent.policy.scheduling.config import SchedulerConfig

THRESHOLD = 256
BATCH_TOKENS = 16384


def engine(long_budget: int = 0) -> EngineModel:
    """A prefill engine; `long_budget` its max_long_batch_tokens (0: whole-budget long batches,
    which the first tests' queues exercise)."""
    m = EngineModel(load_profile("gpu-h200-qwen2.5-32b"), "prefill",
                    SchedulerConfig(length_threshold=THRESHOLD, max_prefill_tokens=BATCH_TOKENS,
                                    max_long_batch_tokens=long_budget))
    calibrate(m)
    return m


def booked(queue: list[int]) -> EndpointLoad:
    """What the gateway books on a pod it sent these prompts to (prefill not ended)."""
    shorts = [t for t in queue if length_class(t, THRESHOLD) == SHORT]
    return EndpointLoad(pending_requests=len(queue), pending_tokens=sum(queue),
                        short_requests=len(shorts), short_tokens=sum(shorts))


def measured(queue: list[int], probe: int, at: float = 0.0, long_budget: int = 0) -> float:
    """Seconds from the probe's arrival to the end of its prefill, on an engine that got `queue`
    at time 0 and started its first batch, the probe arriving `at` seconds later."""
    m = engine(long_budget)
    for i, tokens in enumerate(queue):
        m.add(ModelRequest(f"q{i}", "prefill", tokens, 1, 0.0), 0.0)
    events = list(m.poll(0.0))
    while (t := m.next_time()) is not None and t <= at:
        events += m.poll(t)
    m.add(ModelRequest("probe", "prefill", probe, 1, at), at)
    events += m.poll(at)
    while (t := m.next_time()) is not None:
        events += m.poll(t)
    return next(e.time for e in events if e.rid == "probe" and e.kind == "prefilled") - at


@pytest.mark.parametrize("queue, probe", [
    ([], 100),                              # idle: its own batch
    ([], 6000),
    ([4000], 100),                          # a short behind a running long batch
    ([3000, 3000, 3000], 200),              # ... of several longs: one batch of them
    ([200] * 12, 150),                      # a short behind shorts
    ([3000, 5000], 2000),                   # a long behind longs
    ([120] * 6 + [3000, 3000], 2500),       # a long behind shorts and longs
    ([9000, 9000], 100),                    # a short behind a batch of 16384 tokens
], ids=lambda v: str(v)[:24])
def test_the_predicted_prefill_end_agrees_with_the_emulated_engine(queue, probe):
    m = engine()
    cost = PrefillCost(*m.scheduler.prefill_cost())
    predicted = predicted_seconds(booked(queue), cost, length_class(probe, THRESHOLD), probe, BATCH_TOKENS,
                                  long_batch_tokens=0)
    assert predicted == pytest.approx(measured(queue, probe), rel=0.15)


@pytest.mark.parametrize("queue, probe, at", [
    ([4000], 100, 0.25),                    # a short behind a long batch most of the way through
    ([3000, 3000, 3000], 200, 0.5),
    ([3000, 5000], 2000, 0.6),              # a long behind a batch well under way
    ([200] * 12, 150, 0.1),
], ids=lambda v: str(v)[:24])
def test_a_batch_under_way_is_credited_with_the_time_it_has_run(queue, probe, at):
    """The gateway knows when the pod's running batch began (EndpointLoad.batch_since): the
    prediction counts only what is left of it."""
    m = engine()
    cost = PrefillCost(*m.scheduler.prefill_cost())
    cls = length_class(probe, THRESHOLD)
    credited = predicted_seconds(booked(queue), cost, cls, probe, BATCH_TOKENS, elapsed_s=at, long_batch_tokens=0)
    assert credited == pytest.approx(measured(queue, probe, at), rel=0.15)
    assert credited < predicted_seconds(booked(queue), cost, cls, probe, BATCH_TOKENS, long_batch_tokens=0)


@pytest.mark.parametrize("queue, probe", [
    ([3000, 3000, 3000], 200),              # a short waits for one 3,000-token long, not three
    ([3000, 3000, 3000], 2000),             # a long for three long batches and its own
    ([120] * 6 + [3000, 3000], 2500),
], ids=lambda v: str(v)[:24])
def test_the_prediction_follows_the_engines_long_batch_budget(queue, probe):
    m = engine(long_budget=4096)
    cost = PrefillCost(*m.scheduler.prefill_cost())
    predicted = predicted_seconds(booked(queue), cost, length_class(probe, THRESHOLD), probe, BATCH_TOKENS,
                                  long_batch_tokens=4096)
    assert predicted == pytest.approx(measured(queue, probe, long_budget=4096), rel=0.15)


@pytest.mark.parametrize("into_second", [0.05, 0.2])
def test_a_short_arriving_while_a_later_long_batch_runs_waits_for_that_batch(into_second):
    """The gateway counts a long until its KV is handed off, after the pod has begun its next
    long batch: a short arriving then waits for that batch (it was predicted to start at once)."""
    queue, probe = [3000, 3000, 3000], 200
    m = engine(long_budget=4096)
    cost = PrefillCost(*m.scheduler.prefill_cost())
    at = cost.seconds(queue[0]) + into_second
    predicted = predicted_seconds(booked(queue), cost, SHORT, probe, BATCH_TOKENS, elapsed_s=at,
                                  long_batch_tokens=4096)
    assert predicted == pytest.approx(measured(queue, probe, at, long_budget=4096), rel=0.15)
