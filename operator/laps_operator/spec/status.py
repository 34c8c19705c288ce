"""The shape of a LAPSCluster's `status`, as the operator writes it (status/conditions.py,
allocation/tick.py): the CRD's status schema is generated from it (crd.py), and the API server
keeps only what it declares. A key may be left out (total=False) unless marked Required; a value
typed `X | None` may be written as null (nullable), which the allocation loop does while a reading
is unknown.
"""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Required, TypedDict

from pydantic import Field

# The allocation loop's history keeps this many latest moves.
HISTORY = 10


class Condition(TypedDict, total=False):
    type: Required[str]
    status: Required[Literal["True", "False", "Unknown"]]
    reason: str
    message: str
    lastTransitionTime: datetime
    observedGeneration: int


class GroupMembers(TypedDict, total=False):
    short: list[str]
    long: list[str]


class GroupSizes(TypedDict, total=False):
    short: int
    long: int


class GroupPressure(TypedDict, total=False):
    short: float | None
    long: float | None


class Pressure(TypedDict, total=False):
    short: float | None
    long: float | None
    perPod: Annotated[GroupPressure | None, Field(
        description="each group's pressure divided by its pods (what the policy compares)")]
    source: Literal["prometheus", "gateways"]


class PolicyMemory(TypedDict, total=False):
    wanted: Annotated[str | None, Field(description="the move wanted in the latest intervals")]
    streak: Annotated[int, Field(description="for how many consecutive intervals")]
    lastDirection: Annotated[str | None, Field(description="the latest move's (reversing it costs more)")]
    movedAt: Annotated[dict[str, float], Field(description="pod -> time of its last move (Unix seconds)")]


# "from" is a keyword: the functional form.
Move = TypedDict("Move", {"time": datetime, "pod": str, "from": str, "to": str, "reason": str}, total=False)


class AllocationStatus(TypedDict, total=False):
    lastDecision: Annotated[str, Field(description="what the latest interval decided, and why")]
    policy: Annotated[PolicyMemory, Field(
        description="what the policy remembers between intervals (kept here so a restarted operator goes on)")]
    history: Annotated[list[Move], Field(max_length=HISTORY, description="the latest moves, oldest first")]


class PoolCounts(TypedDict, total=False):
    prefill: int
    decode: int


class PlannedNeed(TypedDict, total=False):
    t: Annotated[float, Field(description="when (Unix seconds)")]
    prefill: int
    decode: int


class PlannerMemory(TypedDict, total=False):
    needs: Annotated[list[PlannedNeed], Field(
        max_length=1000, description="the needs of the stabilisation window (a pool shrinks only to their highest)")]
    lastRate: Annotated[float | None, Field(description="the total arrival rate of the last decision (requests/s)")]
    lastRateTime: Annotated[float | None, Field(description="when it was observed (Unix seconds)")]
    trend: Annotated[float, Field(description="the rate's smoothed slope (requests/s per second)")]
    directions: Annotated[PoolCounts, Field(description="each pool's last change: +1 up, -1 down")]
    changes: Annotated[int, Field(description="direction changes so far")]


class PrefillDraining(TypedDict, total=False):
    pods: Annotated[list[str], Field(description="the prefill pods taken out of routing before a scale-down")]
    target: Annotated[int, Field(description="the prefill count once they are drained")]
    since: Annotated[float, Field(description="when they were taken out (Unix seconds)")]


class AutoscalingStatus(TypedDict, total=False):
    desired: Annotated[PoolCounts, Field(description="the replica counts the planner set (the pools run these)")]
    actual: Annotated[PoolCounts, Field(description="the pods that exist, draining ones included")]
    lastDecision: Annotated[str, Field(description="what the latest interval decided, and why")]
    lastDecisionTime: datetime
    shortNeed: Annotated[int, Field(
        description="the prefill pods the short class needs: new prefill pods join the short group until it has them")]
    draining: Annotated[PrefillDraining | None, Field(
        description="a prefill scale-down under way: its pods out of routing, the count lowered once they are drained")]
    planner: Annotated[PlannerMemory, Field(
        description="what the planner remembers between intervals (kept here so a restarted operator goes on)")]


class ClusterStatus(TypedDict, total=False):
    phase: Literal["Pending", "Progressing", "Ready", "Invalid"]
    observedGeneration: Annotated[int, Field(description="the generation of the spec the status is of")]
    conditions: Annotated[list[Condition], Field(
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Progressing, InvalidSpec, PressureUnavailable, AutoscalingFrozen, WritesFailing "
                    "(docs/contracts.md)")]
    groups: Annotated[GroupMembers, Field(
        description="the prefill pods of each group (a recreated pod gets its group back from here)")]
    groupSizes: Annotated[GroupSizes, Field(description="prefill pods in each group")]
    pressure: Annotated[Pressure | None, Field(
        description="the latest pressure reading (group totals; unset while unknown)")]
    lastRebalanceTime: Annotated[datetime | None, Field(description="when the allocation loop last moved a pod")]
    allocation: Annotated[AllocationStatus, Field(description="the allocation loop's memory and its latest moves")]
    autoscaling: Annotated[AutoscalingStatus | None, Field(
        description="the planner's counts, its latest decision and its memory (unset while autoscaling is off)")]
