"""SmolLM2-135M from its GGUF: real answers, and the bucket path matching one-by-one prefill."""
from __future__ import annotations

import pytest
import torch

from laps_agent.engine.model.runner import ForwardItem, ModelRunner
from laps_agent.policy.scheduling.buckets import BucketGrid

pytestmark = pytest.mark.slow

# fp32, 30 layers: batch shape changes only the summation order of matmuls.
ATOL = 1e-4
PAGE = 16


def _pages(first: int, tokens: int) -> list[int]:
    return list(range(first, first + -(-tokens // PAGE)))


def test_gguf_config_matches_smollm2_135m(smollm2_loaded):
    cfg = smollm2_loaded.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.rope_theta == 100000.0 and cfg.tie_word_embeddings and cfg.vocab_size == 49152
    params = sum(p.numel() for p in smollm2_loaded.model.parameters())
    assert 134_000_000 < params < 135_000_000


def test_greedy_chat_answer_names_paris(smollm2_loaded):
    tok = smollm2_loaded.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    ids = tok.encode(prompt)
    runner = ModelRunner(smollm2_loaded, num_pages=8, page_size=PAGE)
    pages = _pages(0, len(ids) + 16)
    logits, _ = runner.forward([ForwardItem(ids, 0, pages)])
    answer: list[int] = []
    for pos in range(len(ids), len(ids) + 16):
        token = int(logits[0].argmax())
        if token in tok.eos_token_ids:
            break
        answer.append(token)
        if "Paris" in tok.decode(answer):
            break
        logits, _ = runner.forward([ForwardItem([token], pos, pages)])
    assert "Paris" in tok.decode(answer)


def test_bucket_batch_matches_one_by_one(smollm2_loaded):
    tok = smollm2_loaded.tokenizer
    prompts = [tok.encode(t) for t in ("Hello, world!", "The capital of France is",
                                       "Count: 1, 2, 3")]
    grid = BucketGrid([4], [16])
    batched = ModelRunner(smollm2_loaded, num_pages=8, page_size=PAGE, grid=grid)
    items = [ForwardItem(ids, 0, _pages(2 * i, len(ids))) for i, ids in enumerate(prompts)]
    logits, stats = batched.forward(items, bucketed=True)
    assert stats.path == "bucket" and stats.bucket.batch_size == 4

    single = ModelRunner(smollm2_loaded, num_pages=8, page_size=PAGE)
    reference = torch.cat([single.forward([ForwardItem(ids, 0, _pages(0, len(ids)))])[0] for ids in prompts])
    assert (logits - reference).abs().max().item() <= ATOL
    assert logits.argmax(-1).tolist() == reference.argmax(-1).tolist()
