"""The allocation policy (pure): bounds, hysteresis, cooldown, convergence, and the reference rule."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laps_agent.policy.allocation import AllocationConfig, Move, PolicyState, decide, reference_decide

CONFIG = AllocationConfig(ratio=2.0, min_per_group=1, min_pressure=1.0, confirm=2, pod_cooldown_s=60)


def members(short: int, long_: int) -> dict[str, list[str]]:
    pods = [f"p-{i}" for i in range(short + long_)]
    return {"short": pods[:short], "long": pods[short:]}


def apply(groups: dict[str, list[str]], move: Move) -> dict[str, list[str]]:
    out = {g: list(v) for g, v in groups.items()}
    out[move.source].remove(move.pod)
    out[move.target].append(move.pod)
    return out


def run(groups, pressure_of, steps: int, config=CONFIG, interval=5.0):
    """Closed loop: each interval the policy reads the pressure the current split produces."""
    state, moves = PolicyState(), []
    for i in range(steps):
        decision = decide(groups, pressure_of(groups, i), {}, state, i * interval, config)
        state = decision.state
        if decision.move:
            groups = apply(groups, decision.move)
            moves.append((i, decision.move))
    return groups, moves


def queueing_pressure(work: dict[str, float], noise: float = 0.0, seed: int = 0):
    """Pending work a group holds when offered `work` (pod-seconds per second): grows steeply as
    its pods approach saturation (an M/M/1-like 1/(1-rho)), so adding pods relieves it."""
    rng = random.Random(seed)

    def pressure(groups, _step):
        out = {}
        for g, pods in groups.items():
            rho = min(work[g] / len(pods), 0.98)
            out[g] = 100.0 * len(pods) * rho / (1 - rho) * (1 + rng.uniform(-noise, noise))
        return out
    return pressure


def test_unknown_pressure_never_moves():
    state = PolicyState(wanted="short_to_long", streak=5, last_direction="long_to_short")
    for pressure in (None, {"short": 1.0}, {}):
        decision = decide(members(4, 4), pressure, {}, state, 0.0, CONFIG)
        assert decision.move is None and decision.reason == "pressure unknown"
        assert decision.state.streak == 0  # and the hysteresis starts over


@settings(max_examples=300, deadline=None)
@given(short=st.integers(1, 12), long_=st.integers(1, 12), min_per_group=st.integers(1, 4),
       ps=st.floats(0, 1e6), pl=st.floats(0, 1e6), streak=st.integers(0, 3),
       wanted=st.sampled_from([None, "short_to_long", "long_to_short"]))
def test_bounds_hold_and_the_moved_pod_leaves_its_group(short, long_, min_per_group, ps, pl, streak, wanted):
    config = AllocationConfig(min_per_group=min_per_group, confirm=1)
    groups = members(short, long_)
    decision = decide(groups, {"short": ps, "long": pl}, {}, PolicyState(wanted, streak), 100.0, config)
    if decision.move is not None:
        move = decision.move
        assert move.pod in groups[move.source] and move.target != move.source
        after = apply(groups, move)
        assert len(after[move.source]) >= min_per_group
        # it relieves the group that was worse per pod
        per_pod = {g: p / len(groups[g]) for g, p in (("short", ps), ("long", pl))}
        assert per_pod[move.target] >= per_pod[move.source]


def test_hysteresis_wants_the_same_move_twice_before_acting():
    groups, pressure = members(4, 4), {"short": 10.0, "long": 400.0}
    first = decide(groups, pressure, {}, PolicyState(), 0.0, CONFIG)
    assert first.move is None and "1/2" in first.reason
    second = decide(groups, pressure, {}, first.state, 5.0, CONFIG)
    assert second.move is not None and second.move.direction == "short_to_long"
    # a calm interval in between resets it
    calm = decide(groups, {"short": 10.0, "long": 12.0}, {}, first.state, 5.0, CONFIG)
    assert decide(groups, pressure, {}, calm.state, 10.0, CONFIG).move is None


def test_reversing_the_last_move_needs_a_larger_imbalance():
    groups = members(3, 5)
    reversing = PolicyState("long_to_short", 1, last_direction="short_to_long")
    # 3x per pod would move a pod at ratio 2, but reversing the last move needs 2^2 = 4
    held = decide(groups, {"short": 300.0, "long": 166.0}, {}, reversing, 0.0, CONFIG)
    assert held.move is None and "a reversal" in held.reason
    assert decide(groups, {"short": 300.0, "long": 120.0}, {}, reversing, 0.0, CONFIG).move is not None
    onward = PolicyState("long_to_short", 1, last_direction="long_to_short")
    assert decide(groups, {"short": 300.0, "long": 166.0}, {}, onward, 0.0, CONFIG).move is not None


def test_the_pod_with_least_in_flight_work_of_its_class_moves():
    groups = members(3, 3)
    in_flight = {"p-0": 500.0, "p-1": 20.0, "p-2": 300.0}
    state = PolicyState("short_to_long", 1)
    decision = decide(groups, {"short": 30.0, "long": 900.0}, in_flight, state, 0.0, CONFIG)
    assert decision.move == Move("p-1", "short", "long")


def test_idle_noise_moves_nothing():
    state = PolicyState("short_to_long", 1)
    decision = decide(members(4, 4), {"short": 0.0, "long": 3.0}, {}, state, 0.0, CONFIG)
    assert decision.move is None and "no group is under pressure" in decision.reason


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), times=st.lists(st.floats(0, 500), min_size=2, max_size=30))
def test_cooldown_is_respected(seed, times):
    rng = random.Random(seed)
    groups, state, last_move = members(4, 4), PolicyState(), {}
    for now in sorted(times):
        pressure = {"short": rng.uniform(0, 1000), "long": rng.uniform(0, 1000)}
        decision = decide(groups, pressure, {}, state, now, AllocationConfig(confirm=1, pod_cooldown_s=60))
        state = decision.state
        if decision.move:
            pod = decision.move.pod
            assert now - last_move.get(pod, -1e9) >= 60
            last_move[pod] = now
            groups = apply(groups, decision.move)


@settings(max_examples=60, deadline=None)
@given(short_work=st.floats(0.3, 3.0), long_work=st.floats(0.3, 3.0), seed=st.integers(0, 10**6),
       noise=st.floats(0.0, 0.25))
def test_stationary_noisy_load_settles_and_never_flaps(short_work, long_work, seed, noise):
    """Offered work fixed (pod-seconds/s per class on 8 pods), the measured pressure noisy (up to
    +-25% per interval): the policy moves toward balance; a noisy reading may cause one move the
    wrong way, but never a move back after it (no oscillation), and then it stays put."""
    groups, moves = run(members(4, 4), queueing_pressure({"short": short_work, "long": long_work},
                                                         noise, seed), steps=400)
    directions = [m.direction for _, m in moves]
    reversals = [i for i in range(1, len(directions)) if directions[i] != directions[i - 1]]
    assert len(reversals) <= 1, moves
    if reversals:
        assert reversals[0] == len(moves) - 1, moves  # nothing moves after a reversal
    assert len(moves) <= 4, moves


def test_converges_after_a_step_change():
    work = {"short": 2.0, "long": 1.0}
    shifting = queueing_pressure(work)

    def pressure(groups, step):
        if step == 50:  # the mix shifts: long prompts now carry most of the work
            work.update(short=0.5, long=3.5)
        return shifting(groups, step)

    groups, moves = run(members(4, 4), pressure, steps=200)
    before = [m for i, m in moves if i < 50]
    after = [m for i, m in moves if i >= 50]
    assert all(m.direction == "long_to_short" for m in before)
    assert after and all(m.direction == "short_to_long" for m in after)
    assert len(groups["long"]) >= 5 and max(i for i, _ in moves) < 50 + 60  # within a few minutes


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="ratio"):
        AllocationConfig(ratio=0.5)
    with pytest.raises(ValueError, match="min_per_group"):
        AllocationConfig(min_per_group=0)


def test_reference_rule_compares_group_totals():
    groups = members(2, 6)
    assert reference_decide(groups, {"short": 10, "long": 4}) == Move("p-7", "long", "short")
    assert reference_decide(groups, {"short": 2, "long": 5}) == Move("p-1", "short", "long")
    assert reference_decide(groups, {"short": 3, "long": 4}) is None
    assert reference_decide(members(1, 1), {"short": 100, "long": 0}) is None
    assert reference_decide(groups, None) is None
