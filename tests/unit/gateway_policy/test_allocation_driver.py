"""The allocation loop `laps local`'s gateway and `laps sim` share (policy.allocation.AllocationDriver):
samples averaged per interval, the policy's memory kept between steps, the reference rule on
pending request counts, and in-flight work asked for only by the rule that uses it."""
from __future__ import annotations

import pytest

from laps_agent.policy.allocation import REQUEST_COST_TOKENS, AllocationConfig, AllocationDriver, Move
from laps_agent.policy.classes import LONG, SHORT

MEMBERS = {SHORT: ["p-0", "p-1"], LONG: ["p-2", "p-3"]}


def pending(by_group: dict[str, tuple[int, int]]):
    return lambda group: by_group[group]


def no_in_flight() -> dict[str, float]:
    return {}


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="allocation mode must be one of"):
        AllocationDriver("none")


def test_a_step_decides_on_the_mean_of_the_samples_since_the_last_one():
    driver = AllocationDriver("laps", AllocationConfig(confirm=1))
    driver.sample(pending({SHORT: (0, 0), LONG: (2, 3000)}))
    driver.sample(pending({SHORT: (0, 0), LONG: (4, 5000)}))
    move = driver.step(100.0, MEMBERS, no_in_flight)
    assert driver.last["pressure"] == {SHORT: 0.0, LONG: 4000.0 + 3 * REQUEST_COST_TOKENS}
    assert move == Move("p-1", SHORT, LONG)   # equal in-flight work: the highest ordinal
    assert driver.state.moved_at == {"p-1": 100.0} and driver.state.last_direction == "short_to_long"
    # The window starts over: no sample since, so the next decision knows no pressure.
    assert driver.step(105.0, MEMBERS, no_in_flight) is None
    assert driver.last["reason"] == "pressure unknown"


def test_the_move_waits_for_its_confirmations_across_steps():
    driver = AllocationDriver("laps", AllocationConfig(confirm=2))
    moves = []
    for now in (0.0, 5.0):
        driver.sample(pending({SHORT: (0, 0), LONG: (4, 4000)}))
        moves.append(driver.step(now, MEMBERS, no_in_flight))
    assert moves == [None, Move("p-1", SHORT, LONG)]
    assert driver.last["reason"].startswith("short per pod 0")


def test_the_pod_holding_the_least_work_of_its_class_moves():
    driver = AllocationDriver("laps", AllocationConfig(confirm=1))
    driver.sample(pending({SHORT: (0, 0), LONG: (4, 4000)}))
    assert driver.step(0.0, MEMBERS, lambda: {"p-0": 0.0, "p-1": 500.0}) == Move("p-0", SHORT, LONG)


def test_the_reference_rule_counts_pending_requests_and_asks_no_in_flight_work():
    driver = AllocationDriver("reference", AllocationConfig(ratio=2.0))
    driver.sample(pending({SHORT: (1, 10_000), LONG: (5, 10)}))

    def in_flight() -> dict[str, float]:
        raise AssertionError("the reference rule reads no in-flight work")

    assert driver.step(0.0, MEMBERS, in_flight) == Move("p-1", SHORT, LONG)   # the last of short
    assert driver.last == {"reason": "reference rule", "pressure": {SHORT: 1.0, LONG: 5.0}}
    assert driver.step(5.0, MEMBERS, in_flight) is None   # no sample: no move
    assert driver.last["reason"] == "reference rule: no move"
