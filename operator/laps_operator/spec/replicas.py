"""The replica counts the pools run: the planner's, while autoscaling is on (pure)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laps_agent.policy.planner import POOLS
from laps_operator.spec.cluster import ClusterSpec


def replicas_in_force(spec: ClusterSpec, status: Mapping[str, Any] | None) -> ClusterSpec:
    """The spec the pools run: with autoscaling on, its replica counts are the planner's last
    (status.autoscaling.desired, kept within the range), else the spec's own (the planner's
    starting point). Off: the spec, untouched."""
    if not spec.autoscaling.enabled:
        return spec
    desired = ((status or {}).get("autoscaling") or {}).get("desired") or {}
    counts = {}
    for pool in POOLS:
        limits, own = getattr(spec.autoscaling, pool), getattr(spec, pool).replicas
        value = desired.get(pool)
        counts[pool] = min(max(int(value), limits.min), limits.max) if isinstance(value, int) else own
    if counts == {"prefill": spec.prefill.replicas, "decode": spec.decode.replicas}:
        return spec
    return spec.model_copy(update={p: getattr(spec, p).model_copy(update={"replicas": counts[p]}) for p in POOLS})
