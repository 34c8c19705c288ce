"""The request plan: deterministic, phase by phase, with the spec's rates and lengths."""
from __future__ import annotations

import json

import numpy as np
import pytest

from laps_agent.lab.workload import WorkloadError, parse_workload, plan_requests
from laps_agent.lab.workload.lengths import LMSYS_LIKE, length_bounds


def spec(*phases, seed=7, **top):
    return parse_workload({"name": "t", "seed": seed, "phases": list(phases), **top})


def phase(name="p", arrival=None, prompt=None, output=None, **length):
    return {"name": name, **(length or {"requests": 100}),
            "arrival": arrival or {"process": "poisson", "rate": 10},
            "prompt_tokens": prompt or {"distribution": "uniform", "min": 10, "max": 500},
            "output_tokens": output or {"distribution": "fixed", "value": 8}}


def arrays(plan):
    return plan.at, plan.prompt_tokens, plan.output_tokens, plan.phase


def test_same_seed_same_plan_and_another_seed_another():
    s = spec(phase("a"), phase("b", duration_s=5))
    first, second = plan_requests(s), plan_requests(s)
    for x, y in zip(arrays(first), arrays(second)):
        np.testing.assert_array_equal(x, y)
    other = plan_requests(spec(phase("a"), phase("b", duration_s=5), seed=8))
    assert not np.array_equal(first.prompt_tokens[:100], other.prompt_tokens[:100])
    assert not np.array_equal(first.at[:100], other.at[:100])


def test_phases_run_back_to_back_in_order_with_their_counts():
    s = spec(phase("a", requests=30), phase("b", duration_s=10), phase("c", requests=20))
    plan = plan_requests(s)
    counts = [int((plan.phase == i).sum()) for i in range(3)]
    assert counts[0] == 30 and counts[2] == 20 and counts[1] > 0
    assert len(plan) == sum(counts)
    assert np.all(np.diff(plan.phase) >= 0) and np.all(np.diff(plan.at) >= 0)
    a, b, c = plan.phases
    assert a.start_s == 0 and a.end_s == pytest.approx(plan.at[29])
    assert b.start_s == a.end_s and b.end_s == pytest.approx(a.end_s + 10)
    assert c.start_s == b.end_s and plan.at[-1] == pytest.approx(c.end_s)
    in_b = plan.at[plan.phase == 1]
    assert in_b.min() >= b.start_s and in_b.max() < b.end_s
    assert [plan[i].phase for i in (0, 29, 30, len(plan) - 1)] == [0, 0, 1, 2]
    assert plan.phase_name(len(plan) - 1) == "c"


def test_planned_request_access():
    plan = plan_requests(spec(phase("a", requests=5)))
    req = plan[3]
    assert (req.index, req.phase, req.source) == (3, 0, None)
    assert req.at == plan.at[3] and req.prompt_tokens == plan.prompt_tokens[3]
    assert plan[-1].index == 4 and len(list(plan)) == 5
    with pytest.raises(IndexError):
        plan[5]


def test_rate_scale_shortens_counted_phases_and_fills_timed_ones():
    s = spec(phase("count", requests=50, arrival={"process": "constant", "rate": 10}),
             phase("timed", duration_s=20, arrival={"process": "constant", "rate": 10}))
    base, double = plan_requests(s), plan_requests(s, rate_scale=2.0)
    assert base.phases[0].end_s == pytest.approx(5.0) and double.phases[0].end_s == pytest.approx(2.5)
    assert base.phases[1].end_s - base.phases[1].start_s == pytest.approx(20)
    assert double.phases[1].end_s - double.phases[1].start_s == pytest.approx(20)
    assert (base.phase == 1).sum() == 200 - 1 and (double.phase == 1).sum() == 400 - 1
    assert double.phases[1].mean_rate == 20


def test_max_requests_cuts_the_plan():
    s = spec(phase("a", requests=30), phase("b", requests=30), phase("c", requests=30))
    plan = plan_requests(s, max_requests=45)
    assert len(plan) == 45 and [w.requests for w in plan.phases] == [30, 15]
    np.testing.assert_array_equal(plan.at, plan_requests(s).at[:45])


@pytest.mark.parametrize("arrival", [
    {"process": "poisson", "rate": 50},
    {"process": "constant", "rate": 50},
    {"process": "bursty", "rate": 20, "burst_factor": 4, "burst_s": 2, "period_s": 10},
])
def test_max_requests_of_a_timed_phase_is_the_start_of_the_whole_plan(arrival):
    s = spec(phase("a", duration_s=200, arrival=arrival), phase("b", requests=30))
    whole = plan_requests(s)
    for n in (1, 70, 9_000, len(whole) + 5):
        cut = plan_requests(s, max_requests=n)
        np.testing.assert_array_equal(cut.at, whole.at[:n])
        np.testing.assert_array_equal(cut.prompt_tokens, whole.prompt_tokens[:n])


def test_a_phase_too_large_to_plan_is_refused_unless_cut():
    flood = spec(phase("ok", requests=5), phase("flood", duration_s=3600, arrival={"process": "poisson", "rate": 1e9}))
    with pytest.raises(WorkloadError, match=r"phases\[1\]: plans about 3.6e\+12 requests.*--max-requests"):
        plan_requests(flood)
    with pytest.raises(WorkloadError, match=r"phases\[0\]: plans about 1e\+12 requests"):
        plan_requests(spec(phase(requests=10**12)))
    assert len(plan_requests(flood, max_requests=50)) == 50  # only what is kept is drawn
    assert len(plan_requests(spec(phase(requests=10**12)), max_requests=7)) == 7


@pytest.mark.parametrize("dist", [
    {"distribution": "fixed", "value": 33},
    {"distribution": "uniform", "min": 5, "max": 9},
    {"distribution": "lognormal", "median": 100, "sigma": 1.5, "min": 20, "max": 300},
    {"distribution": "lmsys"},
    {"distribution": "mixture", "components": [
        {"weight": 1, "distribution": "uniform", "min": 1, "max": 3},
        {"weight": 2, "distribution": "lognormal", "median": 5000, "sigma": 2, "min": 4000, "max": 6000}]},
])
def test_lengths_stay_within_their_bounds(dist):
    s = spec(phase(requests=20_000, prompt=dist, output=dist))
    plan = plan_requests(s)
    low, high = length_bounds(s.phases[0].prompt_tokens)
    for values in (plan.prompt_tokens, plan.output_tokens):
        assert values.min() >= low and values.max() <= high
    if dist["distribution"] == "uniform":
        assert set(np.unique(plan.prompt_tokens)) == {5, 6, 7, 8, 9}


def test_lognormal_is_truncated_by_redrawing_not_clamped():
    dist = {"distribution": "lognormal", "median": 100, "sigma": 1.0, "min": 50, "max": 200}
    plan = plan_requests(spec(phase(requests=50_000, prompt=dist)))
    # Clamping would put ~25% of the mass on each bound; truncation leaves them ordinary values.
    assert (plan.prompt_tokens == 50).mean() < 0.03 and (plan.prompt_tokens == 200).mean() < 0.03
    assert np.median(plan.prompt_tokens) == pytest.approx(100, rel=0.05)


def test_mixture_weights_are_respected():
    mixture = {"distribution": "mixture", "components": [
        {"weight": 0.85, "distribution": "uniform", "min": 16, "max": 256},
        {"weight": 0.15, "distribution": "lognormal", "median": 1500, "sigma": 0.6, "min": 257, "max": 8000}]}
    plan = plan_requests(spec(phase(requests=200_000, prompt=mixture)))
    assert (plan.prompt_tokens <= 256).mean() == pytest.approx(0.85, abs=0.005)


def test_lmsys_is_one_named_mixture():
    assert LMSYS_LIKE.distribution == "mixture" and len(LMSYS_LIKE.components) >= 2
    plan = plan_requests(spec(phase(requests=100_000, prompt={"distribution": "lmsys"})))
    weights = np.array([c.weight for c in LMSYS_LIKE.components])
    assert weights.sum() == pytest.approx(1.0)
    # the shape its docstring documents: full multi-turn contexts of LMSYS-like chat
    tokens = plan.prompt_tokens
    assert (tokens <= 256).mean() == pytest.approx(0.635, abs=0.01)
    assert (tokens <= 1024).mean() == pytest.approx(0.907, abs=0.01)
    assert np.median(tokens) == pytest.approx(117, rel=0.05)
    assert np.percentile(tokens, 90) == pytest.approx(983, rel=0.05)
    assert tokens.mean() == pytest.approx(349, rel=0.05)


def test_poisson_and_constant_rates():
    plan = plan_requests(spec(phase(duration_s=1000, arrival={"process": "poisson", "rate": 50})))
    assert len(plan) == pytest.approx(50_000, rel=0.03)
    gaps = np.diff(plan.at)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential gaps
    const = plan_requests(spec(phase(requests=10, arrival={"process": "constant", "rate": 4})))
    np.testing.assert_allclose(const.at, np.arange(1, 11) / 4)


def test_bursty_rate_is_higher_in_bursts_and_its_mean_is_reported():
    arrival = {"process": "bursty", "rate": 20, "burst_factor": 4, "burst_s": 2, "period_s": 10}
    s = spec(phase(duration_s=2000, arrival=arrival))
    plan = plan_requests(s)
    mean = s.phases[0].arrival.mean_rate
    assert mean == pytest.approx(20 * (1 + 3 * 0.2)) and plan.phases[0].mean_rate == mean
    assert len(plan) / 2000 == pytest.approx(mean, rel=0.03)
    in_burst = (plan.at % 10) < 2
    assert in_burst.sum() / (2000 * 0.2) == pytest.approx(80, rel=0.05)
    assert (~in_burst).sum() / (2000 * 0.8) == pytest.approx(20, rel=0.05)


def test_bad_rate_scale_is_refused():
    with pytest.raises(ValueError):
        plan_requests(spec(phase()), rate_scale=0)


def test_jsonl_prompts_in_order_with_their_output_tokens(tmp_path, smollm2_tokenizer):
    lines = [{"prompt": "Hello there, how are you?"}, {"prompt": "The quick brown fox.", "output_tokens": 5},
             {"messages": [{"role": "user", "content": "What is the capital of France?"}]}]
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    doc = {"name": "j", "phases": [phase("a", requests=7, prompt={"distribution": "jsonl", "path": "prompts.jsonl"},
                                         output={"distribution": "fixed", "value": 9})]}
    (tmp_path / "w.yaml").write_text(json.dumps(doc))
    from laps_agent.lab.workload import load_workload

    plan = plan_requests(load_workload(tmp_path / "w.yaml"), tokenizer=smollm2_tokenizer)
    assert [plan[i].source.number for i in range(7)] == [1, 2, 3, 1, 2, 3, 1]
    assert plan.output_tokens.tolist() == [9, 5, 9, 9, 5, 9, 9]
    assert plan.prompt_tokens[0] == len(smollm2_tokenizer.encode("Hello there, how are you?"))
    templated = smollm2_tokenizer.apply_chat_template(lines[2]["messages"])
    assert plan.prompt_tokens[2] == len(smollm2_tokenizer.encode(templated))


def test_jsonl_sampling_is_seeded_and_bad_lines_are_reported(tmp_path):
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"prompt": f"word {i}"}) for i in range(50)))
    doc = {"name": "j", "phases": [phase("a", requests=40, prompt={"distribution": "jsonl", "path": "p.jsonl",
                                                                    "order": "sample"})]}
    s = parse_workload(doc, base_dir=tmp_path)
    first, again = plan_requests(s), plan_requests(s)
    np.testing.assert_array_equal(first.line, again.line)
    assert len(set(first.line.tolist())) > 10 and sorted(first.line.tolist()) != first.line.tolist()
    (tmp_path / "p.jsonl").write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    with pytest.raises(WorkloadError, match=r"p.jsonl:2: expected an object with exactly one of"):
        plan_requests(parse_workload(doc, base_dir=tmp_path))
