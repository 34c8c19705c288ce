"""ModelRunner on the tiny model: eager vs bucket paths, cached prefixes, decode, KV hand-off."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from laps_agent.engine.model.runner import ForwardError, ForwardItem, ModelRunner
from laps_agent.policy.scheduling.buckets import BucketGrid, PaddingPlan, SlotPlan, plan_padding

# fp32 throughout; different batch shapes only change summation order.
ATOL = 1e-4
PAGE = 4

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",
    "Hello world!",
    "Prefill computes the key and value cache for the prompt; decode appends one token per step.",
]


def _runner(loaded, grid: BucketGrid | None = None, num_pages: int = 128) -> ModelRunner:
    return ModelRunner(loaded, num_pages=num_pages, page_size=PAGE, grid=grid)


def _pages(first: int, tokens: int) -> list[int]:
    return list(range(first, first + -(-tokens // PAGE)))


def _one_by_one(loaded, prompts: list[list[int]]) -> torch.Tensor:
    runner = _runner(loaded)
    rows = []
    for ids in prompts:
        logits, stats = runner.forward([ForwardItem(ids, 0, _pages(0, len(ids)))])
        assert stats.path == "eager"
        rows.append(logits[0])
    return torch.stack(rows)


@pytest.fixture(scope="module")
def prompts(tiny_loaded) -> list[list[int]]:
    return [tiny_loaded.tokenizer.encode(p) for p in PROMPTS]


def _disjoint_items(prompts: list[list[int]], stride: int = 16) -> list[ForwardItem]:
    return [ForwardItem(ids, 0, _pages(i * stride, len(ids))) for i, ids in enumerate(prompts)]


def test_right_aligned_bucket_batch_matches_one_by_one(tiny_loaded, prompts):
    grid = BucketGrid([1, 2, 4, 8], [16, 32, 64])
    runner = _runner(tiny_loaded, grid)
    logits, stats = runner.forward(_disjoint_items(prompts), bucketed=True)
    assert stats.path == "bucket"
    assert stats.bucket == grid.choose([len(p) for p in prompts])
    assert stats.real_tokens == sum(map(len, prompts))
    assert stats.padded_tokens == stats.bucket.batch_size * stats.bucket.seq_len
    reference = _one_by_one(tiny_loaded, prompts)
    assert (logits - reference).abs().max().item() <= ATOL


def test_eager_packed_batch_matches_one_by_one(tiny_loaded, prompts):
    logits, stats = _runner(tiny_loaded).forward(_disjoint_items(prompts))
    assert stats.path == "eager" and stats.bucket is None
    assert (logits - _one_by_one(tiny_loaded, prompts)).abs().max().item() <= ATOL


def test_left_aligned_padding_is_wrong_under_bottom_right_mask(tiny_loaded, prompts):
    """Same runner, same mask function, only the slot placement differs."""
    bucket = BucketGrid([4], [48]).choose([len(p) for p in prompts])
    seq = bucket.seq_len
    right = plan_padding([len(p) for p in prompts], bucket)
    left = PaddingPlan(
        bucket=bucket,
        slots=tuple(SlotPlan(start=i * seq, length=len(p), dummy=False) for i, p in enumerate(prompts)),
        real_tokens=right.real_tokens, padded_tokens=right.padded_tokens, waste=right.waste)
    reference = _one_by_one(tiny_loaded, prompts)

    right_logits = _runner(tiny_loaded).forward_plan(_disjoint_items(prompts), right)
    left_logits = _runner(tiny_loaded).forward_plan(_disjoint_items(prompts), left)
    assert (right_logits - reference).abs().max().item() <= ATOL
    # Every prompt shorter than the slot loses part of its prefix when left-aligned.
    for i, ids in enumerate(prompts):
        assert len(ids) < seq
        assert (left_logits[i] - reference[i]).abs().max().item() > 1e-2


def test_cached_prefix_plus_suffix_equals_full_prefill(tiny_loaded, prompts):
    ids = prompts[3]
    full = _one_by_one(tiny_loaded, [ids])[0]
    for bucketed in (False, True):
        runner = _runner(tiny_loaded, BucketGrid([1, 2], [8, 16, 32]))
        pages = _pages(5, len(ids))
        split = 9  # not a page boundary, so the suffix shares a page with the prefix
        runner.forward([ForwardItem(ids[:split], 0, pages)])
        logits, stats = runner.forward([ForwardItem(ids[split:], split, pages)], bucketed=bucketed)
        assert stats.path == ("bucket" if bucketed else "eager")
        assert (logits[0] - full).abs().max().item() <= ATOL


def test_decode_after_prefill_equals_prefill_of_longer_sequence(tiny_loaded, prompts):
    runner = _runner(tiny_loaded)
    items = []
    for i, ids in enumerate(prompts):  # different lengths: batched decode pads the page tables
        pages = _pages(i * 16, len(ids) + 1)
        runner.forward([ForwardItem(ids[:-1], 0, pages)])
        items.append(ForwardItem([ids[-1]], len(ids) - 1, pages))
    logits, stats = runner.forward(items)
    assert stats.path == "eager"
    assert (logits - _one_by_one(tiny_loaded, prompts)).abs().max().item() <= ATOL


def test_mixed_prefill_and_decode_in_one_eager_batch(tiny_loaded, prompts):
    runner = _runner(tiny_loaded)
    a, b = prompts[0], prompts[1]
    runner.forward([ForwardItem(a[:-1], 0, _pages(0, len(a)))])
    logits, _ = runner.forward([ForwardItem([a[-1]], len(a) - 1, _pages(0, len(a))),
                                ForwardItem(b, 0, _pages(40, len(b)))])
    assert (logits - _one_by_one(tiny_loaded, [a, b])).abs().max().item() <= ATOL


def test_padding_and_dummy_slots_leave_other_pages_untouched(tiny_loaded, prompts):
    grid = BucketGrid([8], [64])  # 4 prompts in 8 slots: 4 dummy slots plus padding tokens
    runner = _runner(tiny_loaded, grid, num_pages=64)
    items = _disjoint_items(prompts[:2], stride=8)
    used = {p for it in items for p in it.pages}
    runner.k_pool.fill_(7.0)
    runner.v_pool.fill_(-7.0)
    _, stats = runner.forward(items, bucketed=True)
    assert stats.bucket.batch_size == 8 and stats.padded_tokens > stats.real_tokens
    untouched = [p for p in range(runner.num_pages) if p not in used]
    assert torch.all(runner.k_pool[:, untouched] == 7.0)
    assert torch.all(runner.v_pool[:, untouched] == -7.0)
    # The bucket path wrote exactly the same K/V as an eager prefill of the same prompts.
    eager = _runner(tiny_loaded, num_pages=64)
    eager.forward(items)
    for it in items:
        n = len(it.token_ids)
        assert torch.allclose(runner.export_kv(it.pages, n), eager.export_kv(it.pages, n), atol=1e-5)


def test_batch_without_covering_bucket_runs_eager(tiny_loaded, prompts):
    runner = _runner(tiny_loaded, BucketGrid([1, 2], [8]))
    logits, stats = runner.forward(_disjoint_items(prompts), bucketed=True)
    assert stats.path == "eager" and stats.bucket is None
    assert (logits - _one_by_one(tiny_loaded, prompts)).abs().max().item() <= ATOL


def test_export_import_kv_round_trip_gives_identical_decode_logits(tiny_loaded, prompts):
    ids = prompts[3]
    prefill = _runner(tiny_loaded)
    src_pages = _pages(3, len(ids) + 1)
    first, _ = prefill.forward([ForwardItem(ids, 0, src_pages)])
    next_token = int(first[0].argmax())
    kv = prefill.export_kv(src_pages, len(ids))
    cfg = tiny_loaded.config
    assert kv.shape == (cfg.num_layers, 2, len(ids), cfg.num_kv_heads, cfg.head_dim)
    assert kv.device.type == "cpu"

    decode = _runner(tiny_loaded)
    dst_pages = _pages(60, len(ids) + 1)[::-1]  # other ids, other order
    decode.import_kv(dst_pages, kv)
    got, _ = decode.forward([ForwardItem([next_token], len(ids), dst_pages)])
    want, _ = prefill.forward([ForwardItem([next_token], len(ids), src_pages)])
    assert torch.equal(got, want)


def test_malformed_items_are_rejected_with_a_message(tiny_loaded):
    runner = _runner(tiny_loaded, num_pages=8)
    cases = [
        ([], "at least one item"),
        ([ForwardItem([], 0, [0])], "empty"),
        ([ForwardItem([1, 2, 3, 4, 5], 0, [0])], "cannot hold"),
        ([ForwardItem([1], 0, [8])], "out of range"),
        ([ForwardItem([10_000], 0, [0])], "token ids"),
        ([ForwardItem([1], -1, [0])], "start_pos"),
    ]
    for items, message in cases:
        with pytest.raises(ForwardError, match=message):
            runner.forward(items)
    with pytest.raises(ForwardError, match="shape"):
        runner.import_kv([0], torch.zeros(1, 2, 3, 4, 5))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 16)), min_size=1, max_size=4), st.integers(0, 10**6))
def test_any_batch_of_cached_prefixes_and_suffixes_matches_full_prefills(tiny_loaded, shapes, seed):
    """(cached, new) token counts at random, pages scattered: eager batch, bucket batch and a
    one-shot prefill of each whole sequence agree."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, tiny_loaded.config.vocab_size, (c + n,), generator=gen).tolist() for c, n in shapes]
    page_ids = torch.randperm(128, generator=gen).tolist()
    items, cursor = [], 0
    for (cached, _), ids in zip(shapes, seqs):
        count = -(-len(ids) // PAGE)
        items.append((cached, ids, page_ids[cursor:cursor + count]))
        cursor += count
    want = _one_by_one(tiny_loaded, seqs)
    for bucketed in (False, True):
        runner = _runner(tiny_loaded, BucketGrid([1, 2, 4], [4, 8, 16]))
        for cached, ids, pages in items:
            if cached:
                runner.forward([ForwardItem(ids[:cached], 0, pages)])
        batch = [ForwardItem(ids[cached:], cached, pages) for cached, ids, pages in items]
        got, stats = runner.forward(batch, bucketed=bucketed)
        assert stats.path == ("bucket" if bucketed else "eager")
        assert (got - want).abs().max().item() <= ATOL


def test_kv_pool_size_follows_free_memory():
    from laps_agent.engine.core.config import kv_pages_for_memory

    # SmolLM2-like: 30 layers x 3 KV heads x 64 dims, fp32, pages of 16: 737,280 bytes a page
    shape = dict(layers=30, kv_heads=3, head_dim=64, dtype_bytes=4, page_size=16)
    assert kv_pages_for_memory(10 * 737_280, 1.0, **shape) == 9  # one page is the scratch page
    assert kv_pages_for_memory(2**30, 0.5, **shape) == 2**29 // 737_280 - 1
    with pytest.raises(ValueError, match="no room for one KV page"):
        kv_pages_for_memory(737_280, 1.0, **shape)
    with pytest.raises(ValueError, match="mem-fraction"):
        kv_pages_for_memory(2**30, 1.5, **shape)
