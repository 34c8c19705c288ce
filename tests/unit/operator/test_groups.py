"""Group-assignment policy: initial split, recreated pods, scale up and down, restarts."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from laps_agent.policy.groups import PodView, plan_groups

STS = "c-prefill"


def pods(*names_and_labels):
    return [PodView(f"{STS}-{i}", label) for i, label in names_and_labels]


def names(*ordinals):
    return [f"{STS}-{i}" for i in ordinals]


def test_new_cluster_first_half_short_rest_long():
    plan = plan_groups(STS, 4, pods((0, None), (1, None), (2, None), (3, None)), None)
    assert plan.groups == {"short": names(0, 1), "long": names(2, 3)}
    assert plan.label_changes == {n: "short" for n in names(0, 1)} | {n: "long" for n in names(2, 3)}


def test_new_cluster_plans_pods_that_do_not_exist_yet():
    # Pods of a StatefulSet appear one by one; the plan is by name, so the order does not matter.
    plan = plan_groups(STS, 4, pods((3, None)), None)
    assert plan.groups == {"short": names(0, 1), "long": names(2, 3)}
    assert plan.label_changes == {f"{STS}-3": "long"}


def test_odd_and_single_replica_counts():
    assert plan_groups(STS, 3, [], None).groups == {"short": names(0), "long": names(1, 2)}
    assert plan_groups(STS, 1, [], None).groups == {"short": names(0), "long": []}


def test_recreated_pod_gets_its_recorded_group_back():
    recorded = {"short": names(0, 3), "long": names(1, 2)}  # not the initial split: moved earlier
    plan = plan_groups(STS, 4, pods((0, "short"), (1, "long"), (2, "long"), (3, None)), recorded)
    assert plan.groups == recorded
    assert plan.label_changes == {f"{STS}-3": "short"}


def test_restart_with_everything_in_place_changes_nothing():
    recorded = {"short": names(0, 1), "long": names(2, 3)}
    plan = plan_groups(STS, 4, pods((0, "short"), (1, "short"), (2, "long"), (3, "long")), recorded)
    assert plan.groups == recorded and plan.label_changes == {} and plan.moved == {}


def test_lost_status_adopts_existing_labels():
    plan = plan_groups(STS, 4, pods((0, "long"), (1, "short"), (2, "short"), (3, "long")), {})
    assert plan.groups == {"short": names(1, 2), "long": names(0, 3)}
    assert plan.label_changes == {}


def test_scale_up_new_pods_join_the_smaller_group():
    recorded = {"short": names(0, 1), "long": names(2, 3)}
    plan = plan_groups(STS, 6, pods(*((i, g) for i, g in enumerate(["short"] * 2 + ["long"] * 2)), (4, None),
                                    (5, None)), recorded)
    assert plan.groups == {"short": names(0, 1, 4), "long": names(2, 3, 5)}
    assert plan.label_changes == {f"{STS}-4": "short", f"{STS}-5": "long"}

    lopsided = {"short": names(0), "long": names(1, 2, 3)}
    plan = plan_groups(STS, 6, [], lopsided)
    assert plan.groups == {"short": names(0, 4, 5), "long": names(1, 2, 3)}


def test_with_the_planners_short_need_new_pods_join_short_until_it_is_met():
    """The planner grew the pool for long work: 2 short pods meet the short class's need, so the
    four new pods join the long group (the smaller-group rule would have put two in short)."""
    recorded = {"short": names(0, 1), "long": names(2, 3)}
    plan = plan_groups(STS, 8, [], recorded, short_target=2)
    assert plan.groups == {"short": names(0, 1), "long": names(2, 3, 4, 5, 6, 7)}
    # A short need above what short has: the new pods go there first, then long.
    plan = plan_groups(STS, 6, [], recorded, short_target=3)
    assert plan.groups == {"short": names(0, 1, 4), "long": names(2, 3, 5)}
    # Even a need of every pod leaves long one (and a need of none leaves short one).
    assert plan_groups(STS, 3, [], {"short": names(0), "long": names(1)}, short_target=9).groups == \
        {"short": names(0, 2), "long": names(1)}
    assert plan_groups(STS, 3, [], {"short": [], "long": names(0, 1)}, short_target=0).groups == \
        {"short": names(2), "long": names(0, 1)}


def test_scale_down_drops_departed_pods_and_keeps_one_per_group():
    recorded = {"short": names(0, 1, 4), "long": names(2, 3, 5)}
    plan = plan_groups(STS, 3, pods((0, "short"), (1, "short"), (2, "long")), recorded)
    assert plan.groups == {"short": names(0, 1), "long": names(2)}
    assert plan.label_changes == {} and plan.moved == {}

    all_long_survive = {"short": names(3, 4), "long": names(0, 1, 2)}
    plan = plan_groups(STS, 3, pods((0, "long"), (1, "long"), (2, "long")), all_long_survive)
    assert plan.groups == {"short": names(2), "long": names(0, 1)}
    assert plan.moved == {f"{STS}-2": ("long", "short")}
    assert plan.label_changes == {f"{STS}-2": "short"}


def test_scale_down_and_a_raised_minimum_keep_min_per_group_in_each_group():
    # After the allocation loop moved pod 5 to short (long kept its minimum of 2), a scale-down
    # to 4 leaves long with one pod: the highest short ordinal goes back to long.
    recorded = {"short": names(0, 1, 2, 5), "long": names(3, 4)}
    plan = plan_groups(STS, 4, pods((0, "short"), (1, "short"), (2, "short"), (3, "long")), recorded,
                       min_per_group=2)
    assert plan.groups == {"short": names(0, 1), "long": names(2, 3)}
    assert plan.moved == {f"{STS}-2": ("short", "long")} and plan.label_changes == {f"{STS}-2": "long"}
    # Raising the minimum on a live cluster refills the smaller group the same way.
    lopsided = {"short": names(0), "long": names(1, 2, 3, 4, 5)}
    plan = plan_groups(STS, 6, [], lopsided, min_per_group=3)
    assert plan.groups == {"short": names(0, 4, 5), "long": names(1, 2, 3)}
    # Too few pods for both minimums: no group goes below it for the other.
    plan = plan_groups(STS, 3, [], {"short": names(0), "long": names(1, 2)}, min_per_group=2)
    assert plan.groups == {"short": names(0), "long": names(1, 2)} and plan.moved == {}


def test_terminating_pods_and_foreign_pods_are_not_relabelled():
    views = [PodView(f"{STS}-0", None, terminating=True), PodView(f"{STS}-1", None),
             PodView("other-prefill-0", None), PodView(f"{STS}-9", None)]
    plan = plan_groups(STS, 2, views, None)
    assert plan.label_changes == {f"{STS}-1": "long"}


def test_recorded_group_wins_over_a_stray_label():
    recorded = {"short": names(0), "long": names(1)}
    plan = plan_groups(STS, 2, pods((0, "long"), (1, "long")), recorded)
    assert plan.label_changes == {f"{STS}-0": "short"}


@given(st.integers(2, 12), st.integers(2, 12))
def test_any_resize_keeps_every_name_in_exactly_one_group_and_both_groups_filled(before, after):
    first = plan_groups(STS, before, [], None)
    second = plan_groups(STS, after, [], first.groups)
    planned = second.groups["short"] + second.groups["long"]
    assert sorted(planned) == sorted(names(*range(after)))
    assert len(second.groups["short"]) >= 1 and len(second.groups["long"]) >= 1
    # Survivors keep their group unless a group had to be refilled.
    for name in planned:
        if name not in second.moved and name in first.groups["short"] + first.groups["long"]:
            assert second.group_of(name) == first.group_of(name)
