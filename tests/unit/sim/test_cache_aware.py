"""The built-in systems `sglang-cache-aware` (SGLang's router, cache_aware policy) and
`laps-pooled` (one pool, dual queue in every engine, cache affinity)."""
from __future__ import annotations

import numpy as np

from laps_agent.emulated.profile import load_profile
from laps_agent.lab.bench.compare import main as compare
from laps_agent.lab.sim.cluster import SimCluster
from laps_agent.lab.sim.run import simulate
from laps_agent.lab.workload import parse_workload, plan_requests
from laps_agent.policy.cache_aware import CacheAwareConfig, cache_aware_choice, imbalanced
from laps_agent.policy.routing import Endpoint, EndpointLoad
from laps_agent.policy.systems import SIM_ONLY, SYSTEMS

PROFILE = load_profile("gpu-h200-qwen2.5-32b")
PODS = [Endpoint(f"p{i}", f"sim://p{i}", f"p{i}", 0) for i in range(3)]


def loads(*pending: int) -> dict[str, EndpointLoad]:
    return {ep.name: EndpointLoad(pending_requests=n, pending_tokens=100 * n) for ep, n in zip(PODS, pending)}


def test_balanced_loads_follow_the_longest_prefix_match():
    held = {"p0": 0, "p1": 900, "p2": 300}
    choice = cache_aware_choice(1000, PODS, loads(0, 5, 1), lambda ep: held[ep.name], lambda ep: 0)
    assert choice.endpoint.name == "p1" and choice.matched == 900 and choice.balanced


def test_a_match_of_half_the_prompt_or_less_goes_to_the_smallest_tree():
    held = {"p0": 0, "p1": 500, "p2": 0}
    sizes = {"p0": 7000, "p1": 100, "p2": 50}
    choice = cache_aware_choice(1000, PODS, loads(0, 0, 0), lambda ep: held[ep.name], lambda ep: sizes[ep.name])
    assert choice.endpoint.name == "p2" and choice.matched == 0


def test_unbalanced_loads_go_to_the_least_loaded_worker_whatever_it_holds():
    held = {"p0": 0, "p1": 900, "p2": 0}
    assert imbalanced([40, 2, 5]) and not imbalanced([30, 0, 5]) and not imbalanced([40, 40, 39])
    choice = cache_aware_choice(1000, PODS, loads(10, 40, 2), lambda ep: held[ep.name], lambda ep: 0)
    assert choice.endpoint.name == "p2" and not choice.balanced
    lenient = CacheAwareConfig(balance_abs_threshold=64)
    assert cache_aware_choice(1000, PODS, loads(10, 40, 2), lambda ep: held[ep.name], lambda ep: 0,
                              lenient).endpoint.name == "p1"


def test_unhealthy_workers_are_skipped():
    state = loads(0, 0, 0)
    state["p1"] = EndpointLoad(healthy=False)
    choice = cache_aware_choice(1000, PODS, state, lambda ep: 900 if ep.name == "p1" else 0, lambda ep: 0)
    assert choice.endpoint.name != "p1"
    assert cache_aware_choice(10, PODS[1:2], state, lambda ep: 0, lambda ep: 0) is None


def test_a_conversations_turns_stay_on_one_worker_in_the_simulator():
    """Few conversations, far apart: the loads stay balanced, so each later turn (its earlier
    turns more than half of its prompt) goes where the earlier ones went."""
    cluster = SimCluster(PROFILE, SYSTEMS["sglang-cache-aware"], prefill=4, decode=1)
    conv = np.array([0, 1, 0, 1, 0, 1])
    prompts = np.array([1200, 900, 1400, 1100, 1600, 1300])
    at = np.arange(6) * 5.0
    outcome = cluster.run(at, prompts, np.full(6, 8), conv)
    pods = {c: {r.prefill for r in outcome.requests if r.conversation == c} for c in (0, 1)}
    assert all(len(p) == 1 for p in pods.values()) and pods[0] != pods[1]
    assert all(r.status == 200 for r in outcome.requests)
    assert [r.cached > 0 for r in outcome.requests] == [False, False, True, True, True, True]


def test_unbalanced_simulated_loads_route_to_the_least_loaded_worker():
    """One conversation's growing prompts, all sent at once: each matches the one before, so
    they pile onto one pod while the loads count as balanced; once that pod has 33 more pending
    requests than the other (balance_abs_threshold 32), the next goes to the idle pod."""
    cluster = SimCluster(PROFILE, SYSTEMS["sglang-cache-aware"], prefill=2, decode=1)
    n = 40
    outcome = cluster.run(np.arange(n) * 1e-5, 2000 + 64 * np.arange(n), np.full(n, 8), np.full(n, 7))
    pods = [r.prefill for r in outcome.requests]
    assert len(set(pods[:33])) == 1 and pods[33] != pods[0]
    assert all(r.status == 200 for r in outcome.requests)


def test_laps_pooled_runs_one_pool_with_affinity():
    spec = parse_workload({"name": "w", "seed": 2, "phases": [{
        "name": "p", "requests": 200, "arrival": {"process": "poisson", "rate": 40},
        "prompt_tokens": {"distribution": "lmsys"}, "output_tokens": {"distribution": "fixed", "value": 8}}]})
    pooled = SYSTEMS["laps-pooled"]
    assert not pooled.groups and pooled.affinity and pooled.laps_scheduler and pooled.allocation == "none"
    result = simulate(plan_requests(spec), PROFILE, pooled, prefill=4, decode=1, threshold=256)
    status = result.records.columns["status"]
    assert len(status) == 200 and (status == 200).all()
    assert "--single-pool" in pooled.local_args()


def test_sglang_cache_aware_is_sim_only_and_bench_compare_refuses_it(capsys):
    assert SIM_ONLY == {"sglang-cache-aware"}
    assert compare(["--workload", "lmsys-steady", "--systems", "vanilla-pd,sglang-cache-aware"]) == 2
    err = capsys.readouterr().err
    assert "sglang-cache-aware exists only in the simulator" in err
