"""The bottom-right causal mask that every attention path shares, and flash-attn against SDPA."""
from __future__ import annotations

import pytest
import torch

from laps_agent.engine.model.attention import (
    bottom_right_causal_mask,
    flash_applies,
    flash_attn_with_kvcache,
    paged_attention,
    sdpa_paged,
)


def test_queries_sit_at_the_end_of_their_sequence():
    # Sequence 0: 3 new tokens, no cache. Sequence 1: 3 new tokens after 2 cached ones.
    mask = bottom_right_causal_mask(3, torch.tensor([3, 5]), key_len=6)
    assert mask[0].int().tolist() == [[1, 0, 0, 0, 0, 0],
                                      [1, 1, 0, 0, 0, 0],
                                      [1, 1, 1, 0, 0, 0]]
    assert mask[1].int().tolist() == [[1, 1, 1, 0, 0, 0],
                                      [1, 1, 1, 1, 0, 0],
                                      [1, 1, 1, 1, 1, 0]]


def test_right_aligned_padding_keeps_real_rows_and_left_aligned_loses_them():
    # A 2-token prompt in a 4-token slot: kv_len is 2 either way.
    mask = bottom_right_causal_mask(4, torch.tensor([2]), key_len=4)[0].int().tolist()
    # Right-aligned, real tokens are rows 2 and 3: exactly the causal rows of a 2-token prompt.
    assert mask[2:] == [[1, 0, 0, 0], [1, 1, 0, 0]]
    # Left-aligned, they would be rows 0 and 1, which see nothing of their own (row 1 should see
    # keys 0 and 1); only the finite-softmax fallback to key 0 remains.
    assert mask[:2] == [[1, 0, 0, 0], [1, 0, 0, 0]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(flash_attn_with_kvcache is None, reason="flash-attn is not installed")
@pytest.mark.parametrize("page_size", [16, 256])  # gathered pages; flash-attn reading our pages
def test_flash_attn_path_answers_as_sdpa_over_the_same_pages(page_size):
    """bf16 on CUDA takes flash-attn; it must see the same keys as the SDPA path: a fresh
    sequence and one with a cached prefix spanning pages, queries bottom-right aligned."""
    torch.manual_seed(0)
    heads, kv_heads, dim, pages = 9, 3, 64, 6
    pool = dict(device="cuda", dtype=torch.bfloat16)
    k_pool = torch.randn(pages + 1, page_size, kv_heads, dim, **pool)
    v_pool = torch.randn(pages + 1, page_size, kv_heads, dim, **pool)
    q = torch.randn(2, 5, heads, dim, **pool)
    kv_lens = torch.tensor([5, page_size + 7], device="cuda", dtype=torch.int32)
    page_table = torch.tensor([[4, pages], [1, 3]], device="cuda", dtype=torch.int32)
    assert flash_applies(q)
    flash = paged_attention(q, k_pool, v_pool, page_table, kv_lens)
    sdpa = sdpa_paged(q, k_pool, v_pool, page_table, kv_lens)
    assert (flash.float() - sdpa.float()).abs().max().item() <= 2e-2
