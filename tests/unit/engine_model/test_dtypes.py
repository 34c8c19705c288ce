"""Half precision: the engine loads straight into bf16/fp16, the rotary tables stay fp32, and
SmolLM2's greedy answers in bf16 match fp32 on CPU."""
from __future__ import annotations

import pytest
import torch

from laps_agent.engine.model.llama import rope_inverse_frequencies
from laps_agent.engine.model.loader import ModelLoadError, load_model, resolve_dtype
from laps_agent.engine.model.runner import ForwardItem, ModelRunner

PAGE = 16
PROMPTS = ("What is the capital of France?", "Name three primary colours.",
           "Write a haiku about the sea.", "What is 12 times 12?", "Who wrote Hamlet?")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_weights_take_the_dtype_and_rotary_stays_fp32(tiny_model_dir, dtype):
    loaded = load_model(tiny_model_dir, dtype=dtype)
    assert {p.dtype for p in loaded.model.parameters()} == {dtype}
    assert loaded.model.inv_freq.dtype == torch.float32
    assert torch.equal(loaded.model.inv_freq, rope_inverse_frequencies(loaded.config))
    runner = ModelRunner(loaded, num_pages=4, page_size=PAGE)
    assert runner.k_pool.dtype == dtype  # the KV cache follows the model
    logits, _ = runner.forward([ForwardItem([1, 2, 3], 0, [0])])
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_auto_dtype_is_bf16_on_cuda_and_fp32_on_cpu():
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("auto", "cuda:1") == torch.bfloat16
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("float16", "cpu") == torch.float16
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("fp8", "cpu")


def _greedy(loaded, text: str, steps: int = 24) -> list[int]:
    tok = loaded.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
    runner = ModelRunner(loaded, num_pages=8, page_size=PAGE)
    pages = list(range(-(-(len(ids) + steps) // PAGE)))
    logits, _ = runner.forward([ForwardItem(ids, 0, pages)])
    out: list[int] = []
    for pos in range(len(ids), len(ids) + steps):
        token = int(logits[0].argmax())
        out.append(token)
        if token in tok.eos_token_ids:
            break
        logits, _ = runner.forward([ForwardItem([token], pos, pages)])
    return out


def _next_token_distribution(loaded, text: str) -> torch.Tensor:
    tok = loaded.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
    logits, _ = ModelRunner(loaded, num_pages=8, page_size=PAGE).forward([ForwardItem(ids, 0, list(range(8)))])
    return logits[0].softmax(-1)


@pytest.mark.slow
def test_bf16_greedy_answers_stay_close_to_fp32_on_smollm2(smollm2_loaded, smollm2_path):
    """The difference, stated and bounded: bf16 keeps 8 bits of mantissa, so where two tokens are
    nearly tied the greedy choice may flip and the answers part from there ("colour"/"color").
    Measured on these prompts: 3 of 5 answers identical over 24 tokens, every first token the
    same, next-token distributions within total variation 0.04 of fp32."""
    bf16 = load_model(smollm2_path, dtype=torch.bfloat16)
    answers = [(_greedy(bf16, p), _greedy(smollm2_loaded, p)) for p in PROMPTS]
    assert all(b[0] == f[0] for b, f in answers)
    assert sum(b == f for b, f in answers) >= 3, answers
    for prompt in PROMPTS:
        tv = 0.5 * (_next_token_distribution(bf16, prompt) - _next_token_distribution(smollm2_loaded, prompt)).abs().sum()
        assert tv <= 0.05, (prompt, float(tv))
