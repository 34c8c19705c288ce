"""Multi-turn conversations in the plan: turn structure, timing and determinism."""
from __future__ import annotations

import numpy as np
import pytest

from laps_agent.lab.workload import WorkloadError, load_workload, parse_workload, plan_requests
from laps_agent.lab.workload.conversations import oracle_cached_tokens


def spec(seed: int = 3, turns=None, **conv):
    return parse_workload({"name": "mt", "seed": seed, "api": "chat", "phases": [{
        "name": "chat", "duration_s": 60, "arrival": {"process": "poisson", "rate": 1},
        "prompt_tokens": {"distribution": "uniform", "min": 20, "max": 400},
        "output_tokens": {"distribution": "uniform", "min": 50, "max": 300},
        "conversation": {"turns": turns or {"distribution": "uniform", "min": 2, "max": 5},
                         "new_tokens": {"distribution": "uniform", "min": 5, "max": 100}, **conv}}]})


def test_each_turn_resends_the_conversation_plus_the_answer_and_a_new_message():
    plan = plan_requests(spec())
    assert len(plan) > 60 and (np.diff(plan.at) >= 0).all()
    for c in np.unique(plan.conversation):
        turns = plan.turns_of(int(c))
        assert [int(plan.turn[i]) for i in turns] == list(range(1, len(turns) + 1))
        assert 2 <= len(turns) <= 5
        first = turns[0]
        assert plan.history_tokens[first] == 0 and plan.new_tokens[first] == plan.prompt_tokens[first]
        for prev, cur in zip(turns, turns[1:]):
            assert plan.history_tokens[cur] == plan.prompt_tokens[prev]
            assert plan.prompt_tokens[cur] == (plan.prompt_tokens[prev] + plan.output_tokens[prev]
                                               + plan.new_tokens[cur])
            # Read the answer at 30 tokens/s, then think at least 2 s.
            assert plan.at[cur] - plan.at[prev] >= plan.output_tokens[prev] / 30 + 2 - 1e-9


def test_the_same_seed_gives_the_same_conversations_and_another_seed_others():
    a, b, c = plan_requests(spec(7)), plan_requests(spec(7)), plan_requests(spec(8))
    for name in ("at", "prompt_tokens", "output_tokens", "conversation", "turn", "new_tokens", "history_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.prompt_tokens[:20], c.prompt_tokens[:20])


def test_a_conversation_ends_before_its_prompt_passes_the_bound():
    plan = plan_requests(spec(turns={"distribution": "fixed", "value": 50}, max_prompt_tokens=2000))
    assert plan.prompt_tokens.max() <= 2000
    assert plan.turn.max() < 50


def test_bad_think_times_name_the_field():
    with pytest.raises(WorkloadError, match="min_think_s"):
        spec(think_s=1.0, min_think_s=5.0)


def test_the_builtin_workload_is_mostly_small_additions_to_long_conversations():
    plan = plan_requests(load_workload("multi-turn-chat"))
    later = plan.turn >= 2
    added = (plan.prompt_tokens - plan.history_tokens)[later]
    assert 0.7 < (added < 256).mean() < 0.9            # LMSYS-Chat-1M: 81%
    assert (plan.prompt_tokens[later] > 256).mean() > 0.5


def test_the_oracle_holds_the_previous_prompt_in_whole_pages():
    cached = oracle_cached_tokens(np.array([100, 1040, 20]), np.array([0, 1000, 20]), 16)
    assert cached.tolist() == [0, 992, 16]
