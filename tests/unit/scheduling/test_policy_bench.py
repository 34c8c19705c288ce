"""The policy simulation behind `python -m scripts.policy_bench` (simulated time)."""
from __future__ import annotations

from laps_agent.policy.scheduling import SchedulerConfig
from scripts.policy_bench import Workload, simulate

# CPU-like costs from the engine notes: ~50 ms per batch + ~2.2 ms per token (SmolLM2, fp32)
CPU = Workload(overhead_s=0.050, per_token_s=0.0022, rate=1.2, requests=400)


def mean(values):
    return sum(values) / len(values)


def test_every_request_gets_a_first_token_once():
    ttft = simulate(SchedulerConfig(wait_window_ms=20, adaptive_window=True), CPU)
    assert len(ttft["short"]) + len(ttft["long"]) == CPU.requests
    assert min(ttft["short"] + ttft["long"]) > 0


def test_short_first_lowers_short_ttft_against_fifo_on_a_mixed_workload():
    fifo = simulate(SchedulerConfig(enabled=False), CPU)
    laps = simulate(SchedulerConfig(wait_window_ms=0), CPU)
    assert mean(laps["short"]) < mean(fifo["short"])


def test_our_window_rule_keeps_short_requests_out_from_behind_long_cpu_prefills():
    load = Workload(overhead_s=0.050, per_token_s=0.0022, rate=1.0, long_tokens=600, requests=400)
    ours = simulate(SchedulerConfig(wait_window_ms=100), load)
    reference = simulate(SchedulerConfig(wait_window_ms=100), load, reference_rule=True)
    assert mean(ours["short"]) < mean(reference["short"])
