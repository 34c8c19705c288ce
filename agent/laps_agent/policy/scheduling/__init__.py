"""LAPS prefill scheduling: dual queues, waiting window, bucket grid (torch-free, engine-agnostic).

One policy, three drivers: the builtin engine, the SGLang plugin and the simulator.
"""
from __future__ import annotations

from laps_agent.policy.scheduling.buckets import Bucket, BucketGrid, PaddingPlan, SlotPlan, plan_padding
from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_agent.policy.scheduling.queues import FIFO, LONG, SHORT, Decision, PrefillItem, PrefillScheduler
from laps_agent.policy.scheduling.window import PrefillCostModel, WaitWindow, WindowSetting

__all__ = [
    "Bucket", "BucketGrid", "Decision", "FIFO", "LONG", "PaddingPlan", "PrefillCostModel",
    "PrefillItem", "PrefillScheduler", "SHORT", "SchedulerConfig", "SlotPlan", "WaitWindow",
    "WindowSetting", "plan_padding",
]
