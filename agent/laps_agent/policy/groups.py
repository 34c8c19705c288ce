"""Group-assignment policy for prefill pods (pure: no API calls).

Membership is planned by pod *name*: a StatefulSet's pod names are stable, so the plan covers
ordinals 0..replicas-1 whether or not their pods exist now. It is recorded in the LAPSCluster's
status, which gives a recreated pod its group back and keeps a restarted operator from changing
any label. Rules, in order:
0. A pod labelled DRAINING is in no group: the planner is taking it away (its Services no longer
   select it, so the gateway sends it nothing new) and it keeps that label until it is gone or
   the planner gives it back (it then joins as rule 4 says).
1. A name recorded in status keeps its recorded group.
2. Else a pod with a valid group label keeps it (status lost, or written by an older operator:
   the label is the truth the gateway already routes by).
3. Nothing recorded nor labelled (a new cluster): the first half of the ordinals (at least one)
   is short, the rest long, as the reference router splits its instances.
4. Any other new name (a scale-up) joins as `joining_group` says: the short group until it has
   the planner's short need (where the planner runs), else the smaller group; ties go to short.
5. Names at or beyond `replicas` (a scale-down) leave the plan. While a group then has fewer
   than `min_per_group` pods (1, or laps.allocation.minPerGroup with allocation on) and the
   other has more, the other's highest ordinal moves over: the allocation loop never takes a
   group below its minimum, but a scale-down (or a raised minimum) can, and the group would stay
   under it until pressure happened to ask for a pod the other way.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from laps_agent.policy.classes import CLASSES, LONG, OTHER, SHORT

# The group label value of a prefill pod the planner is taking away (rule 0).
DRAINING = "draining"


@dataclass(frozen=True)
class PodView:
    name: str
    group_label: str | None = None   # current value of laps.io/prefill-group
    terminating: bool = False        # has a deletionTimestamp: leave its labels alone
    ready: bool = False              # its Ready condition is True: the Services route to it


@dataclass(frozen=True)
class GroupPlan:
    groups: dict[str, list[str]]                       # group (CLASSES) -> pod names by ordinal
    label_changes: dict[str, str] = field(default_factory=dict)  # existing pod -> group to write
    moved: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (from, to), rule 5

    @property
    def sizes(self) -> dict[str, int]:
        return {g: len(names) for g, names in self.groups.items()}

    def group_of(self, name: str) -> str | None:
        return next((g for g, names in self.groups.items() if name in names), None)


def pod_ordinal(pod_name: str, statefulset: str) -> int | None:
    """Ordinal of a StatefulSet pod (`<sts>-<n>`), None for a pod of another set."""
    prefix = f"{statefulset}-"
    if not pod_name.startswith(prefix):
        return None
    tail = pod_name[len(prefix):]
    return int(tail) if tail.isdigit() else None


def initial_short_count(replicas: int) -> int:
    return max(1, replicas // 2) if replicas > 0 else 0


def joining_group(short: int, long_: int, short_target: int | None = None) -> str:
    """Rule 4: the group a new prefill pod joins, beside `short` and `long_` pods: short until the
    planner's `short_target` is met (at least one pod each side where there are two), else the
    smaller group, ties short. The operator's group sync, `laps sim` and `laps local` apply it."""
    if short_target is not None:
        total = short + long_ + 1
        return SHORT if short < min(max(short_target, 1), max(total - 1, 1)) else LONG
    return SHORT if short <= long_ else LONG


def plan_groups(
    statefulset: str,
    replicas: int,
    pods: Sequence[PodView],
    recorded: Mapping[str, Sequence[str]] | None,
    min_per_group: int = 1,
    short_target: int | None = None,
) -> GroupPlan:
    """`short_target`: the prefill pods the planner says the short class needs (rule 4)."""
    recorded_group = {
        name: group for group in CLASSES for name in (recorded or {}).get(group, ()) or ()
    }
    by_name = {p.name: p for p in pods if pod_ordinal(p.name, statefulset) is not None}
    names = [f"{statefulset}-{i}" for i in range(replicas)]
    assignment: dict[str, str] = {}
    unassigned: list[str] = []
    for name in names:
        label = by_name[name].group_label if name in by_name else None
        if label == DRAINING:
            continue
        if name in recorded_group:
            assignment[name] = recorded_group[name]
        elif label in CLASSES:
            assignment[name] = label
        else:
            unassigned.append(name)

    fresh_cluster = not recorded_group and not any(p.group_label in CLASSES for p in by_name.values())
    if fresh_cluster:
        short = initial_short_count(replicas)
        for name in unassigned:
            assignment[name] = SHORT if pod_ordinal(name, statefulset) < short else LONG
    else:
        for name in unassigned:
            sizes = _sizes(assignment)
            assignment[name] = joining_group(sizes[SHORT], sizes[LONG], short_target)

    moved = _keep_minimum(assignment, statefulset, min_per_group)
    groups = {g: sorted((n for n, a in assignment.items() if a == g), key=lambda n: pod_ordinal(n, statefulset))
              for g in CLASSES}
    label_changes = {
        name: group
        for name, group in assignment.items()
        if name in by_name and not by_name[name].terminating and by_name[name].group_label != group
    }
    return GroupPlan(groups=groups, label_changes=label_changes, moved=moved)


def _sizes(assignment: Mapping[str, str]) -> dict[str, int]:
    sizes = dict.fromkeys(CLASSES, 0)
    for group in assignment.values():
        sizes[group] += 1
    return sizes


def _keep_minimum(assignment: dict[str, str], statefulset: str, minimum: int) -> dict[str, tuple[str, str]]:
    moved: dict[str, tuple[str, str]] = {}
    minimum = max(1, minimum)
    for short_of in CLASSES:
        donor_group = OTHER[short_of]
        sizes = _sizes(assignment)
        # Never below the minimum on the donor's side: with too few pods for both, each keeps what it can.
        while sizes[short_of] < minimum and sizes[donor_group] > minimum:
            donor = max((n for n, g in assignment.items() if g == donor_group),
                        key=lambda n: pod_ordinal(n, statefulset))
            assignment[donor] = short_of
            moved[donor] = (donor_group, short_of)
            sizes = _sizes(assignment)
    return moved
