"""Which over-long prompts the gateway refuses itself, ahead of admission (gateway/context.py):
only those it is certain no engine takes. A prompt an engine would serve must never get a 400
from the gateway's guess, so heuristic counts and batch sums refuse nothing."""
from __future__ import annotations

import pytest

from laps_agent.gateway.estimate import PromptCount, TokenEstimator
from laps_agent.gateway.http.context import refuse_over_context
from laps_agent.gateway.proxy.failures import GatewayError
from laps_agent.modelio.prompt_rules import PromptLimit

LIMIT = 511   # the engines' max_prompt_tokens (a context of 512)


def _refused(estimator: TokenEstimator, body: dict, kind: str) -> bool:
    try:
        refuse_over_context(estimator.count(body, kind), PromptLimit(LIMIT))
    except GatewayError as exc:
        assert (exc.status, exc.kind) == (400, "context_length_exceeded")
        assert exc.message.startswith(f"the prompt has {estimator.estimate(body, kind)} tokens; "
                                      f"this engine takes at most {LIMIT}")
        return True
    return False


@pytest.mark.parametrize("mode", ["auto", "heuristic", "chars4"])
def test_token_ids_over_the_limit_are_refused_whatever_the_estimator(mode):
    estimator = TokenEstimator(None, mode)
    assert _refused(estimator, {"prompt": [5] * (LIMIT + 1)}, "completion")
    assert _refused(estimator, {"input_ids": [5] * 600}, "generate")
    assert not _refused(estimator, {"prompt": [5] * LIMIT}, "completion")


def test_a_heuristic_count_refuses_nothing():
    estimator, text = TokenEstimator(None), "word " * 2000
    assert estimator.estimate({"prompt": text}, "completion") > 2 * LIMIT
    assert not _refused(estimator, {"prompt": text}, "completion")
    assert not _refused(estimator, {"messages": [{"role": "user", "content": text}]}, "chat")


def test_a_batch_is_not_judged_by_its_sum():
    # Each prompt fits; the engine takes them one by one, so their sum says nothing.
    assert not _refused(TokenEstimator(None), {"prompt": [[5] * 300, [5] * 300]}, "completion")


def test_without_the_engines_limit_nothing_is_refused():
    refuse_over_context(PromptCount(10**6, exact=True), None)


def test_with_the_tokenizer_text_and_chat_over_the_limit_are_refused(smollm2_tokenizer):
    estimator, text = TokenEstimator(smollm2_tokenizer), "word " * 600
    assert _refused(estimator, {"prompt": text}, "completion")
    assert _refused(estimator, {"messages": [{"role": "user", "content": text}]}, "chat")
    assert not _refused(estimator, {"prompt": "word " * 100}, "completion")


def test_a_developer_message_counts_as_the_engine_renders_it(smollm2_tokenizer):
    """The engine renders OpenAI's `developer` role as `system`. Counted as another role, the
    template added its default system prompt too: ~20 tokens more than the engine's count,
    enough to refuse a prompt the engine takes."""
    estimator = TokenEstimator(smollm2_tokenizer)
    question = {"role": "user", "content": "What is the capital of France?"}
    developer = estimator.count({"messages": [{"role": "developer", "content": "Be brief."}, question]}, "chat")
    system = [{"role": "system", "content": "Be brief."}, question]
    rendered = smollm2_tokenizer.apply_chat_template(system, add_generation_prompt=True)
    assert developer == PromptCount(len(smollm2_tokenizer.encode(rendered)), exact=True)
