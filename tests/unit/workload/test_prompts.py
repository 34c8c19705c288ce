"""Prompt text of an exact token count in the real SmolLM2 tokenizer, completions and chat."""
from __future__ import annotations

import pytest

from laps_agent.lab.workload import PromptBuilder

LENGTHS = [1, 2, 3, 4, 5, 6, 7, 16, 63, 255, 256, 257, 1000, 4000, 9000]


@pytest.fixture(scope="module")
def builder(smollm2_tokenizer):
    return PromptBuilder(smollm2_tokenizer, seed=11)


@pytest.mark.parametrize("n", LENGTHS)
def test_text_has_exactly_n_tokens(builder, smollm2_tokenizer, n):
    for index in (0, 1, 977):
        built = builder.build_text(n, index)
        assert len(smollm2_tokenizer.encode(built.value)) == n
        assert built.tokens == n and builder.text(n, index) == built.value


@pytest.mark.parametrize("n", [31, 32, 40, 256, 257, 3000])
def test_chat_messages_template_to_exactly_n_tokens(builder, smollm2_tokenizer, n):
    built = builder.build_messages(n, 5)
    assert built.value[0]["role"] == "user" and len(built.value) == 1
    templated = smollm2_tokenizer.apply_chat_template(built.value)
    assert len(smollm2_tokenizer.encode(templated)) == n == built.tokens


def test_chat_below_the_template_overhead_uses_the_minimum_and_says_so(builder, smollm2_tokenizer):
    overhead = builder.chat_overhead()
    assert overhead > 0
    for n in (1, overhead):
        built = builder.build_messages(n, 2)
        real = len(smollm2_tokenizer.encode(smollm2_tokenizer.apply_chat_template(built.value)))
        assert built.tokens == real == overhead + 1


def test_prompts_are_deterministic_and_share_no_prefix(smollm2_tokenizer):
    a, b = PromptBuilder(smollm2_tokenizer, seed=1), PromptBuilder(smollm2_tokenizer, seed=1)
    assert a.text(500, 42) == b.text(500, 42)
    assert PromptBuilder(smollm2_tokenizer, seed=2).text(500, 42) != a.text(500, 42)
    first_tokens = {tuple(smollm2_tokenizer.encode(a.text(300, i))[:6]) for i in range(2000)}
    assert len(first_tokens) == 2000


def test_build_follows_the_api(builder):
    assert isinstance(builder.build(50, 1, "completions").value, str)
    assert isinstance(builder.build(50, 1, "chat").value, list)


def test_chars_per_token_describes_the_filler(builder, smollm2_tokenizer):
    text = builder.text(4000, 3)
    assert builder.chars_per_token == pytest.approx(len(text) / 4000, rel=0.1)
    assert 2.0 < builder.chars_per_token < 10.0


def test_without_a_tokenizer_one_word_is_one_token_and_counts_are_unknown():
    builder = PromptBuilder(None, seed=0)
    assert builder.mode == "approximate"
    built = builder.build_text(120, 9)
    assert len(built.value.split()) == 120 and built.tokens is None
    assert builder.build_messages(120, 9).tokens is None and builder.chat_overhead() is None


def test_a_tokenizer_that_merges_across_words_gets_exact_counts_by_encoding():
    """A real BPE tokenizer trained here without splitting at spaces (" the of" can be 2 tokens
    or 3): the builder notices, and fits each prompt by encoding it."""
    import random

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from laps_agent.lab.workload.prompts import COMMON_WORDS
    from laps_agent.modelio.tokenizer import Tokenizer

    rng = random.Random(0)
    corpus = [" ".join(rng.choices(COMMON_WORDS[:60], k=50)) for _ in range(300)]
    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    tokenizer = Tokenizer(backend, chat_template=template, eos_token_ids=frozenset(), bos_token_id=None)

    builder = PromptBuilder(tokenizer, seed=0)
    assert builder.mode == "encode"
    for n in (1, 7, 100, 1000):
        built = builder.build_text(n, n)
        assert len(tokenizer.encode(built.value)) == built.tokens == n
        chat = builder.build_messages(n + 20, n)
        assert len(tokenizer.encode(tokenizer.apply_chat_template(chat.value))) == chat.tokens == n + 20
