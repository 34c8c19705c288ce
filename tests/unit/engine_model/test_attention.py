"""The bottom-right causal mask that every attention path shares."""
from __future__ import annotations

import torch

from laps_agent.engine.attention import bottom_right_causal_mask


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
