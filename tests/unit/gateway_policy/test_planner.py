"""The planner policy (policy/planner.py): what an operator of a sized cluster would notice.

Costs are the gpu-h200-qwen2.5-32b profile's (its prefill engine's fit and its decode step), so
the counts read as a 32B deployment's."""
from __future__ import annotations

import numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from laps_agent.policy.classes import LONG, SHORT
from laps_agent.policy.planner import (
    ClassLoad,
    Observation,
    PlannerConfig,
    PlannerState,
    PodCosts,
    Pools,
    Slo,
    UtilisationState,
    drain_order,
    erlang_c,
    need,
    plan,
    utilisation_plan,
    wait_quantile,
)

COSTS = PodCosts(prefill_overhead_s=0.0171, prefill_per_token_s=0.000101, decode_overhead_s=0.017,
                 decode_per_request_s=5e-05, decode_per_context_token_s=6.8e-08, decode_max_running=128,
                 decode_kv_tokens=234140, transfer_per_token_s=8.8e-06)
SLO = Slo({SHORT: 0.5, LONG: 3.0}, 0.05)
CONFIG = PlannerConfig(max_prefill=12, max_decode=6, gpu_budget=16, interval_s=30, startup_s=120)


def mix(rate: float, short_share: float = 0.7, output: float = 180.0) -> dict[str, ClassLoad]:
    return {SHORT: ClassLoad(rate * short_share, 136, 136, output),
            LONG: ClassLoad(rate * (1 - short_share), 1800, 1800, output)}


def observe(t: float, rate: float, **kw) -> Observation:
    return Observation(t, mix(rate, **kw))


START = Pools(3, 2)


def run(rates, config=CONFIG, start=START, existing=None):
    """Drive the planner one interval per rate, pods appearing as soon as they are set."""
    state, pools, plans = PlannerState(), start, []
    for i, rate in enumerate(rates):
        now = (i + 1) * config.interval_s
        p = plan(observe(now, rate), COSTS, SLO, pools, existing or pools, state, now, config)
        state, pools = p.state, Pools(p.prefill, p.decode)
        plans.append(p)
    return plans


def test_erlang_c_and_the_wait_quantile_behave_as_queues_do():
    assert erlang_c(1, 0.5) == 0.5                      # M/M/1: P(wait) = utilisation
    assert erlang_c(4, 0.0) == 0.0 and erlang_c(4, 4.0) == 1.0
    assert wait_quantile(4, 10.0, 0.1) < wait_quantile(2, 10.0, 0.1) < wait_quantile(2, 19.0, 0.1)
    assert wait_quantile(1, 11.0, 0.1) == float("inf")  # over capacity: no finite wait


def test_need_grows_with_the_load_and_with_long_prompts():
    light, heavy = need(mix(10), COSTS, SLO, CONFIG), need(mix(60), COSTS, SLO, CONFIG)
    assert 1 <= light.prefill < heavy.prefill and 1 <= light.decode < heavy.decode
    assert need(mix(40, short_share=0.3), COSTS, SLO, CONFIG).prefill > need(mix(40, short_share=0.9), COSTS, SLO,
                                                                            CONFIG).prefill
    assert need(mix(0), COSTS, SLO, CONFIG) == need({}, COSTS, SLO, CONFIG)
    assert (need({}, COSTS, SLO, CONFIG).prefill, need({}, COSTS, SLO, CONFIG).decode) == (0, 0)


def test_a_tighter_slo_needs_more_prefill_pods_and_an_impossible_one_says_so():
    loose = need(mix(40), COSTS, Slo({SHORT: 2.0, LONG: 10.0}, 0.05), CONFIG)
    tight = need(mix(40), COSTS, Slo({SHORT: 0.3, LONG: 0.6}, 0.05), CONFIG)
    assert tight.prefill > loose.prefill and not tight.limit
    impossible = need(mix(40), COSTS, Slo({SHORT: 0.5, LONG: 0.1}, 0.05), CONFIG)
    assert "long" in impossible.limit and "SLO" in impossible.limit


def test_waiting_work_adds_pods_beyond_the_arrivals():
    calm = need(mix(40), COSTS, SLO, CONFIG)
    backlog = {c: ClassLoad(x.rate, x.uncached_tokens, x.prompt_tokens, x.output_tokens, waiting=600)
               for c, x in mix(40).items()}
    assert need(backlog, COSTS, SLO, CONFIG).prefill > calm.prefill


def test_missing_or_stale_metrics_or_unknown_costs_freeze_and_say_why():
    pools = Pools(5, 3)
    for observation, costs, words in ((None, COSTS, "metrics missing"), (observe(0.0, 40), COSTS, "metrics stale"),
                                      (observe(1000.0, 40), None, "costs unknown")):
        p = plan(observation, costs, SLO, pools, pools, PlannerState(), 1000.0, CONFIG)
        assert p.frozen and words in p.reason and (p.prefill, p.decode) == (5, 3)


def test_a_constant_load_settles_and_never_changes_direction():
    plans = run([40.0] * 60)
    settled = [(p.prefill, p.decode) for p in plans[5:]]
    assert len(set(settled)) == 1
    assert plans[-1].state.changes == 0


def test_a_constant_load_counted_with_its_chance_noise_never_changes_direction():
    # What a gateway counts in 30 s of a steady Poisson load varies by its square root: an hour
    # of it, at rates across the pod boundaries, from three seeds each. (Without the noise rules
    # the planner changed direction up to 12 times in such an hour.)
    for rate in (8, 15, 25, 40, 55, 70):
        for seed in range(3):
            rng = numpy.random.default_rng(seed)
            plans = run([rng.poisson(rate * 30) / 30 for _ in range(120)])
            after_the_first_window = plans[-1].state.changes - plans[9].state.changes
            assert after_the_first_window == 0, (rate, seed, [(p.prefill, p.decode) for p in plans])


def test_zero_traffic_scales_to_the_minimum_after_the_stabilisation_window():
    plans = run([40.0] * 10 + [0.0] * 30)
    assert (plans[-1].prefill, plans[-1].decode) == (CONFIG.min_prefill, CONFIG.min_decode)
    # ...but not at the first idle interval: a dip keeps the pods for the window.
    first_idle = plans[10]
    assert (first_idle.prefill, first_idle.decode) == (plans[9].prefill, plans[9].decode)
    assert "kept for the last 120s" in first_idle.reason     # and the decision says why


def test_a_rising_load_is_planned_ahead_of_start_up():
    plans = run([10, 15, 20, 25, 30, 35, 40])
    rising = plans[-1]
    assert "ahead of start-up" in rising.reason
    assert rising.prefill >= rising.need.prefill


def test_steps_are_bounded_and_the_budget_is_shared_by_need():
    config = PlannerConfig(max_prefill=40, max_decode=40, gpu_budget=12, max_step=2)
    p = plan(observe(30.0, 200), COSTS, SLO, Pools(2, 1), Pools(2, 1), PlannerState(), 30.0, config)
    assert (p.prefill, p.decode) == (4, 3)             # two pods a step each
    state, pools = PlannerState(), Pools(2, 1)
    for i in range(20):
        p = plan(observe(30.0 * (i + 1), 200), COSTS, SLO, pools, pools, state, 30.0 * (i + 1), config)
        state, pools = p.state, Pools(p.prefill, p.decode)
    assert config.gpus(pools.prefill, pools.decode) == 12 and "budget" in p.reason
    assert pools.prefill > pools.decode >= 1


def test_a_pool_grows_only_into_gpus_that_draining_pods_have_freed():
    # The mix turns decode-heavy at the budget: decode may grow only as prefill pods are gone.
    config = PlannerConfig(max_prefill=12, max_decode=12, gpu_budget=10, scale_down_stabilization_s=0)
    heavy_decode = Observation(30.0, {SHORT: ClassLoad(30, 20, 20, 900), LONG: ClassLoad(0.1, 300, 300, 900)})
    p = plan(heavy_decode, COSTS, SLO, Pools(8, 2), Pools(8, 2), PlannerState(), 30.0, config)
    assert p.prefill < 8 and p.decode == 2 and "draining" in p.reason
    gone = plan(heavy_decode, COSTS, SLO, Pools(p.prefill, 2), Pools(p.prefill, 2), p.state, 60.0, config)
    assert gone.decode > 2 and config.gpus(gone.prefill, gone.decode) <= 10


load_paths = st.lists(st.floats(0, 300), min_size=1, max_size=40)


@st.composite
def configs(draw) -> PlannerConfig:
    """Limits a user may set: the budget holds the minimum pools and a little more, or is absent."""
    per_prefill, lo_p, lo_d = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    spare = draw(st.one_of(st.none(), st.integers(2, 20)))
    return PlannerConfig(min_prefill=lo_p, max_prefill=draw(st.integers(lo_p, 20)), min_decode=lo_d,
                         max_decode=draw(st.integers(lo_d, 10)), gpus_per_prefill=per_prefill,
                         gpu_budget=None if spare is None else lo_p * per_prefill + lo_d + spare,
                         max_step=draw(st.integers(1, 4)),
                         scale_down_stabilization_s=draw(st.sampled_from([0.0, 60.0, 300.0])))


@settings(max_examples=150, deadline=None)
@given(rates=load_paths, config=configs(), draining=st.integers(0, 3), short=st.floats(0, 1))
def test_every_step_is_bounded_within_limits_and_never_over_the_budget(rates, config, draining, short):
    state, pools = PlannerState(), Pools(config.min_prefill, config.min_decode)
    for i, rate in enumerate(rates):
        now = (i + 1) * config.interval_s
        held = Pools(pools.prefill + draining if i % 3 == 0 else pools.prefill, pools.decode)
        if config.gpu_budget is not None and config.gpus(held.prefill, held.decode) > config.gpu_budget:
            held = pools
        p = plan(observe(now, rate, short_share=short), COSTS, SLO, pools, held, state, now, config)
        assert config.min_prefill <= p.prefill <= config.max_prefill
        assert config.min_decode <= p.decode <= config.max_decode
        assert abs(p.prefill - pools.prefill) <= config.max_step and abs(p.decode - pools.decode) <= config.max_step
        if config.gpu_budget is not None:
            # What exists (draining pods too) plus what is ordered stays within the budget.
            assert config.gpus(max(p.prefill, held.prefill), max(p.decode, held.decode)) <= config.gpu_budget
        state, pools = p.state, Pools(p.prefill, p.decode)


def test_the_utilisation_baseline_follows_the_busy_share_like_an_hpa():
    pools, state = Pools(4, 2), UtilisationState()
    up, state, _ = utilisation_plan({"prefill": 1.0, "decode": 0.35}, pools, state, 30.0, CONFIG)
    assert up.prefill == 6 and up.decode == 2          # ceil(4 x 1.0 / 0.7); decode held (stabilised)
    same, _, _ = utilisation_plan({"prefill": 0.72, "decode": 0.7}, up, state, 60.0, CONFIG)
    assert same == up                                  # within the 10% tolerance
    assert utilisation_plan(None, pools, state, 90.0, CONFIG)[0] == pools


def test_a_statefulset_drains_its_highest_ordinals_other_pools_the_least_busy():
    names = ["p-0", "p-1", "p-2", "p-10"]
    assert drain_order(names, {"p-10": 9.0}, ordinals=True)[:2] == ["p-10", "p-2"]
    assert drain_order(names, {"p-0": 0.0, "p-1": 3.0, "p-2": 0.0, "p-10": 1.0}, ordinals=False) == [
        "p-2", "p-0", "p-10", "p-1"]
