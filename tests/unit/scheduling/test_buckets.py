from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laps_agent.policy.scheduling import Bucket, BucketGrid, plan_padding

sizes = st.lists(st.integers(1, 16), min_size=1, max_size=5)


@settings(deadline=None)
@given(batch_sizes=sizes, seq_lengths=st.lists(st.integers(1, 512), min_size=1, max_size=6),
       lengths=st.lists(st.integers(1, 600), min_size=1, max_size=20))
def test_chosen_bucket_covers_the_batch_and_no_smaller_bucket_does(batch_sizes, seq_lengths, lengths):
    grid = BucketGrid(batch_sizes, seq_lengths)
    chosen = grid.choose(lengths)
    covering = [b for b in grid.buckets if b.batch_size >= len(lengths) and b.seq_len >= max(lengths)]
    if not covering:
        assert chosen is None
        return
    assert chosen in covering
    assert min(b.batch_size * b.seq_len for b in covering) == chosen.batch_size * chosen.seq_len
    # the tie-break is deterministic: the same batch always gets the same bucket
    assert grid.choose(list(lengths)) == chosen


def test_grid_is_the_sorted_cross_product():
    grid = BucketGrid([4, 1, 2, 2], [64, 16])
    assert grid.max_batch_size == 4 and grid.max_seq_len == 64
    assert len(grid.buckets) == 6
    assert grid.buckets[0] == Bucket(1, 16)
    assert grid.choose([10, 17]) == Bucket(2, 64)
    assert grid.choose([1] * 5) is None
    assert grid.choose([65]) is None
    assert grid.choose([]) is None


def test_bad_grids_and_lengths_are_refused_with_a_message():
    with pytest.raises(ValueError, match="at least one batch size"):
        BucketGrid([], [16])
    with pytest.raises(ValueError, match=">= 1"):
        BucketGrid([0, 2], [16])
    with pytest.raises(ValueError, match=">= 1 token"):
        BucketGrid([2], [16]).choose([3, 0])
    with pytest.raises(ValueError, match="does not fit"):
        plan_padding([1, 2, 3], Bucket(2, 16))
    with pytest.raises(ValueError, match="seq_len is 16"):
        plan_padding([17], Bucket(2, 16))


@settings(deadline=None)
@given(data=st.data(), batch_size=st.integers(1, 8), seq_len=st.integers(1, 256))
def test_padding_plan_is_right_aligned_and_disjoint(data, batch_size, seq_len):
    n = data.draw(st.integers(1, batch_size))
    lengths = data.draw(st.lists(st.integers(1, seq_len), min_size=n, max_size=n))
    plan = plan_padding(lengths, Bucket(batch_size, seq_len))
    assert len(plan.slots) == batch_size
    occupied: set[int] = set()
    for i, slot in enumerate(plan.slots):
        slot_begin, slot_end = i * seq_len, (i + 1) * seq_len
        span = set(range(slot.start, slot.start + slot.length))
        assert span and min(span) >= slot_begin and max(span) < slot_end  # inside its own slot
        assert not span & occupied
        occupied |= span
        # right-aligned: the last token sits at the slot's last position
        assert plan.last_index(i) == slot_end - 1 == slot.start + slot.length - 1
        if i < n:
            assert not slot.dummy and slot.length == lengths[i]
            assert slot.start == i * seq_len + (seq_len - lengths[i])
        else:
            assert slot.dummy and slot.length == 1
    assert plan.real_tokens == sum(lengths)
    assert plan.padded_tokens == batch_size * seq_len
    assert plan.waste == plan.padded_tokens - plan.real_tokens >= 0


def test_padding_plan_example():
    plan = plan_padding([10, 3], Bucket(4, 16))
    assert [(s.start, s.length, s.dummy) for s in plan.slots] == [
        (6, 10, False), (29, 3, False), (47, 1, True), (63, 1, True)]
    assert [plan.last_index(i) for i in range(4)] == [15, 31, 47, 63]
    assert (plan.real_tokens, plan.padded_tokens, plan.waste) == (13, 64, 51)
