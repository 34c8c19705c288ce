"""Workloads for `laps bench run|compare` and `laps sim`: a YAML spec of phases (spec), token
length distributions (lengths), arrival processes (arrivals), JSONL prompt files (jsonl), the
deterministic request plan (plan) and exact-length prompt text (prompts)."""
from __future__ import annotations

from laps_agent.lab.workload.plan import PhaseWindow, Plan, PlannedRequest, plan_requests
from laps_agent.lab.workload.prompts import BuiltPrompt, PromptBuilder
from laps_agent.lab.workload.spec import WorkloadError, WorkloadSpec, available_workloads, load_workload, parse_workload

__all__ = ["BuiltPrompt", "PhaseWindow", "Plan", "PlannedRequest", "PromptBuilder", "WorkloadError",
           "WorkloadSpec", "available_workloads", "load_workload", "parse_workload", "plan_requests"]
