"""`laps sim` on multi-turn conversations: affinity keeps turns on the pod that holds them, the
engines' caches make their prefill cheap, and the report has what issue 12 asks for."""
from __future__ import annotations

import dataclasses

import numpy as np

from laps_agent.emulated.profile import load_profile
from laps_agent.lab.results.turns import summarize_turns, targets_markdown, turns_markdown
from laps_agent.lab.sim.run import simulate
from laps_agent.lab.workload import parse_workload, plan_requests
from laps_agent.policy.systems import SYSTEMS

PROFILE = load_profile("gpu-h200-qwen2.5-32b")
SPEC = parse_workload({"name": "mt", "seed": 4, "api": "chat", "phases": [{
    "name": "chat", "duration_s": 40, "arrival": {"process": "poisson", "rate": 3},
    "prompt_tokens": {"distribution": "uniform", "min": 200, "max": 1500},
    "output_tokens": {"distribution": "uniform", "min": 50, "max": 200},
    "conversation": {"turns": {"distribution": "fixed", "value": 4},
                     "new_tokens": {"distribution": "uniform", "min": 5, "max": 60},
                     "think_s": 5, "min_think_s": 1}}]})


def run(system: str):
    return simulate(plan_requests(SPEC), PROFILE, SYSTEMS[system], prefill=4, decode=1, threshold=256)


def test_affinity_reaches_the_oracles_hit_rate_and_plain_routing_does_not():
    laps, plain = summarize_turns(run("laps")), summarize_turns(run("laps-noaffinity"))
    assert laps.oracle_hit_rate and laps.oracle_hit_rate > 0.5
    assert laps.hit_rate >= 0.9 * laps.oracle_hit_rate
    assert plain.hit_rate < 0.7 * laps.hit_rate
    assert laps.ttft_p90_later < plain.ttft_p90_later
    text = turns_markdown([("laps-noaffinity", plain), ("laps", laps)]) + targets_markdown(
        ("laps-noaffinity", plain), ("laps", laps))
    for needle in ("prefix hit rate", "TTFT p90, turn 5+", "max pod load / group mean", "<= 0.6x"):
        assert needle in text


def test_later_turns_are_served_where_the_earlier_ones_were():
    result = run("laps")
    rec = result.records
    later = rec.ok & (rec.turn >= 2)
    # Every later turn found its conversation's earlier prompt cached (in whole pages).
    history = plan_requests(SPEC).history_tokens
    assert (rec.cached_tokens[later] >= (history[later] // 16) * 16 - 16).mean() > 0.95


def test_warming_caches_each_answer_so_later_turns_prefill_only_the_new_message():
    plan = plan_requests(SPEC)
    warm = run("laps").records
    cold = simulate(plan, PROFILE, dataclasses.replace(SYSTEMS["laps"], prefix_warm=False), prefill=4,
                    decode=1, threshold=256).records
    later = warm.ok & (warm.turn >= 2)
    # The previous prompt and its answer (whole pages) were cached: only the new message is left.
    new = plan.new_tokens
    assert (warm.prompt_tokens[later] - warm.cached_tokens[later] <= new[later] + 16).mean() > 0.9
    assert (cold.prompt_tokens[later] - cold.cached_tokens[later] <= new[later] + 16).mean() < 0.1
    assert summarize_turns(run("laps")).ttft_p90_later < summarize_turns(
        simulate(plan, PROFILE, dataclasses.replace(SYSTEMS["laps"], prefix_warm=False), prefill=4, decode=1,
                 threshold=256)).ttft_p90_later


def test_single_requests_share_nothing():
    spec = parse_workload({"name": "s", "seed": 1, "phases": [{
        "name": "p", "duration_s": 10, "arrival": {"process": "poisson", "rate": 5},
        "prompt_tokens": {"distribution": "uniform", "min": 20, "max": 900},
        "output_tokens": {"distribution": "fixed", "value": 4}}]})
    result = simulate(plan_requests(spec), PROFILE, SYSTEMS["laps"], prefill=2, decode=1, threshold=256)
    assert (result.records.cached_tokens[result.records.ok] == 0).all()
    assert np.all(result.records.turn == -1)


def test_the_oracle_reference_finds_every_earlier_turn():
    from laps_agent.lab.results.turns import turns_report
    from laps_agent.lab.sim.run import ORACLE, sim_system

    assert sim_system("laps-oracle") is ORACLE and sim_system("laps") is SYSTEMS["laps"]
    plan = plan_requests(SPEC)
    oracle = simulate(plan, PROFILE, ORACLE, prefill=4, decode=1, threshold=256)
    rec = oracle.records
    # Its cache is the oracle of the workload's own definition (whole pages of the previous turn).
    expected = np.minimum((plan.history_tokens // 16) * 16, plan.prompt_tokens - 1)
    assert (rec.cached_tokens[rec.ok] == expected[rec.ok]).all()
    best, laps, plain = (summarize_turns(r) for r in (oracle, run("laps"), run("laps-noaffinity")))
    unwarmed = summarize_turns(simulate(plan, PROFILE, dataclasses.replace(SYSTEMS["laps"], prefix_warm=False),
                                        prefill=4, decode=1, threshold=256))
    assert best.hit_rate == best.oracle_hit_rate
    # No router beats it on what earlier prompts left cached; warming caches the answers too.
    assert unwarmed.hit_rate <= best.hit_rate < laps.hit_rate
    assert max(best.ttft_p90_later, laps.ttft_p90_later) < plain.ttft_p90_later
    report = turns_report([("laps-noaffinity", plain), ("laps", laps), ("laps-oracle", best)])
    # The targets still judge laps against its baseline; the oracle is a reference row.
    assert "laps vs laps-noaffinity" in report and "laps-oracle (every earlier turn cached)" in report
