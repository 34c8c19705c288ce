"""The allocation loop `laps local`'s gateway and `laps sim` share (policy.allocation.AllocationDriver):
the classes' offered prefill work per second over each interval, the policy's memory kept between
steps, the reference rule on pending request counts, and in-flight work asked for only by the
rule that uses it."""
from __future__ import annotations

import pytest

from laps_agent.policy.allocation import (
    STAND_IN_COST,
    AllocationConfig,
    AllocationDriver,
    Move,
    OfferedRate,
    fleet_cost,
    offered_seconds,
)
from laps_agent.policy.classes import LONG, SHORT
from laps_agent.policy.placement import PrefillCost

MEMBERS = {SHORT: ["p-0", "p-1"], LONG: ["p-2", "p-3"]}


def pending(by_group: dict[str, tuple[int, int]]):
    return lambda group: by_group[group]


def no_in_flight() -> dict[str, float]:
    return {}


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="allocation mode must be one of"):
        AllocationDriver("none")


def test_a_request_offers_its_prefill_at_the_pods_mean_measured_cost():
    cost = fleet_cost([PrefillCost(0.02, 1e-4), None, PrefillCost(0.04, 3e-4)])
    assert cost == PrefillCost(pytest.approx(0.03), pytest.approx(2e-4))
    assert offered_seconds(1000, cost) == pytest.approx(0.03 + 0.2)
    # No pod has reported a cost (stock SGLang): the stand-in's.
    assert fleet_cost([None, None]) is None
    assert offered_seconds(1000, None) == pytest.approx(STAND_IN_COST.seconds(1000))


def test_a_step_decides_on_the_offered_work_per_second_since_the_last_one():
    driver = AllocationDriver("laps", AllocationConfig(confirm=1))
    driver.begin(100.0, {SHORT: 1.0, LONG: 2.0})
    # Over 5 s: 0.5 s of short work (5% of each short pod's time) and 9 s of long (90% of each long pod's).
    move = driver.step(105.0, MEMBERS, no_in_flight, {SHORT: 1.5, LONG: 11.0})
    assert driver.last["pressure"] == {SHORT: pytest.approx(0.1), LONG: pytest.approx(1.8)}
    assert driver.last["per_pod"] == {SHORT: pytest.approx(0.05), LONG: pytest.approx(0.9)}
    assert move == Move("p-1", SHORT, LONG)   # equal in-flight work: the highest ordinal
    assert driver.state.moved_at == {"p-1": 105.0} and driver.state.last_direction == "short_to_long"


def test_no_work_offered_moves_nothing():
    driver = AllocationDriver("laps", AllocationConfig(confirm=1))
    driver.begin(0.0, {})
    assert driver.step(5.0, MEMBERS, no_in_flight, {SHORT: 0.0, LONG: 0.04}) is None
    assert driver.last["reason"] == "no group is under pressure"


def test_without_a_start_the_first_step_knows_no_rate():
    driver = AllocationDriver("laps", AllocationConfig(confirm=1))
    assert driver.step(5.0, MEMBERS, no_in_flight, {SHORT: 0.0, LONG: 50.0}) is None
    assert driver.last["reason"] == "pressure unknown"
    assert driver.step(10.0, MEMBERS, no_in_flight, {SHORT: 0.0, LONG: 60.0}) == Move("p-1", SHORT, LONG)


def test_a_counter_that_went_back_grows_by_nothing():
    rate = OfferedRate()
    rate.take(0.0, {SHORT: 10.0, LONG: 10.0})
    assert rate.take(2.0, {SHORT: 3.0, LONG: 14.0}) == {SHORT: 0.0, LONG: 2.0}


def test_the_move_waits_for_its_confirmations_across_steps():
    driver = AllocationDriver("laps", AllocationConfig(confirm=2))
    driver.begin(0.0, {})
    moves = [driver.step(now, MEMBERS, no_in_flight, {SHORT: 0.0, LONG: now}) for now in (5.0, 10.0)]
    assert moves == [None, Move("p-1", SHORT, LONG)]
    assert driver.last["reason"].startswith("short per pod 0")


def test_the_pod_holding_the_least_work_of_its_class_moves():
    driver = AllocationDriver("laps", AllocationConfig(confirm=1))
    driver.begin(0.0, {})
    assert driver.step(5.0, MEMBERS, lambda: {"p-0": 0.0, "p-1": 500.0}, {LONG: 5.0}) == Move("p-0", SHORT, LONG)


def test_the_reference_rule_counts_pending_requests_and_asks_no_in_flight_work():
    driver = AllocationDriver("reference", AllocationConfig(ratio=2.0))
    driver.sample(pending({SHORT: (1, 10_000), LONG: (5, 10)}))

    def in_flight() -> dict[str, float]:
        raise AssertionError("the reference rule reads no in-flight work")

    assert driver.step(0.0, MEMBERS, in_flight, {}) == Move("p-1", SHORT, LONG)   # the last of short
    assert driver.last == {"reason": "reference rule", "pressure": {SHORT: 1.0, LONG: 5.0}}
    assert driver.step(5.0, MEMBERS, in_flight, {}) is None   # no sample: no move
    assert driver.last["reason"] == "reference rule: no move"
