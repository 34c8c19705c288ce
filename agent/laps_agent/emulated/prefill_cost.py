"""What a prefill batch costs on the engine model: its duration and the record the builtin engine
would log for it.

Separate from the state machine (core.py) because this is where the model's time comes from:
pure arithmetic on the profile and the bucket grid, with no engine state. The path is the
builtin engine's own choice (`bucket_for_batch`); only the seconds are the profile's.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from laps_agent.emulated.profile import Profile
from laps_agent.emulated.requests import ModelRequest
from laps_agent.engine.core.config import PrefillRecord, PrefillRequest
from laps_agent.policy.scheduling.buckets import Bucket, BucketGrid, bucket_for_batch
from laps_agent.policy.scheduling.queues import PrefillScheduler
from laps_agent.policy.scheduling.window import calibration_lengths


def prefill_batch_cost(profile: Profile, grid: BucketGrid | None, queue: str, uncached: list[int],
                       cached: list[int], mode: str) -> tuple[float, Bucket | None]:
    """Seconds the batch takes and the bucket it runs in (None: eager): the padded / CUDA-graph
    bucket when `bucket_for_batch` finds it cheaper by the profile's own costs."""
    def cost(b: Bucket | None) -> float:
        return profile.prefill_seconds(uncached, cached, (b.batch_size, b.seq_len) if b else None)

    bucket = bucket_for_batch(grid, queue, uncached, mode=mode, graphs=profile.graphs, cost=cost)
    return cost(bucket), bucket


def prefill_record(queue: str, uncached: list[int], bucket: Bucket | None, seconds: float,
                   graphs: bool, batch: Sequence[ModelRequest] = ()) -> PrefillRecord:
    """The builtin engine's record of the batch (benchmarks and metrics read these), with its
    requests: the prefix-cache and class series (laps_engine_prefix_cache_*, _class_total)
    count them."""
    path = "eager" if bucket is None else ("graph" if graphs else "bucket")
    return PrefillRecord(cls=queue if queue != "fifo" else None, size=len(uncached),
                         real_tokens=sum(uncached), padded_tokens=bucket.tokens if bucket else sum(uncached),
                         path=path, bucketed=bucket is not None, seconds=seconds,
                         requests=[PrefillRequest(r.prompt_tokens, r.cached_tokens, r.cls, r.gateway_cls)
                                   for r in batch])


class Calibrated(Protocol):
    """What `calibrate` reads of an engine model (core.py's EngineModel)."""

    profile: Profile
    role: str
    scheduler: PrefillScheduler

    def max_prompt_tokens(self) -> int: ...


def calibrate(model: Calibrated) -> None:
    """What the builtin engine measures at start-up (engine/calibration.py), from the profile: an
    eager prefill of each calibration length, fed to the model's cost fit, so that a fresh
    emulated (or simulated) prefill engine reports its speed from the start, as the builtin one
    does. A decode engine is not calibrated."""
    if model.role == "decode":
        return
    lengths = calibration_lengths(model.max_prompt_tokens(), model.scheduler.config.max_prefill_tokens)
    model.scheduler.calibrate([(tokens, model.profile.prefill_seconds([tokens])) for tokens in lengths])
