"""The batch-prefill bucket grid and the right-aligned padding plan.

A bucket is one captured (batch_size, seq_len) shape. A batch of prompts of lengths l_1..l_n runs in
the bucket with the fewest padded tokens among those with batch_size >= n and seq_len >= max(l).
The grid is the full cross product of the configured batch sizes and sequence lengths, so that
bucket is simply (smallest batch size >= n, smallest seq_len >= max(l)): any other covering
bucket is at least as large in both dimensions. There are therefore no ties to break.

Padding is right-aligned: slot i occupies [i*S, (i+1)*S) of the flat buffer and its real tokens
sit at the *end* of the slot, starting at i*S + (S - len). Flash-attention style kernels use a
bottom-right aligned causal mask (query p sees key j <= p + cache_len - seqlen_q), so real
tokens at the end of the slot see their whole prefix while left-aligned ones would be masked
out; the logits processor reads each slot's last position, which is then the last real token.
Dummy slots (i >= n) hold a single token at their last position (length 1), so their attention
metadata stays valid without costing real work.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Sequence

from laps_agent.policy.classes import SHORT


@dataclass(frozen=True, order=True)
class Bucket:
    batch_size: int
    seq_len: int

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


def _positive_sorted(values: Sequence[int], what: str) -> list[int]:
    out = sorted(set(int(v) for v in values))
    if not out:
        raise ValueError(f"bucket grid needs at least one {what}")
    if out[0] < 1:
        raise ValueError(f"bucket grid {what} must be >= 1, got {out[0]}")
    return out


# The default grid: the batch-prefill graphs captured when nothing else is asked for (engine flags,
# the LAPSCluster's laps.batchPrefillGraphs).
DEFAULT_BATCH_SIZES = (1, 2, 4, 8)
DEFAULT_SEQ_LENGTHS = (16, 32, 64, 128, 256)


class BucketGrid:
    """Cross product of batch sizes and sequence lengths (both deduplicated and sorted)."""

    def __init__(self, batch_sizes: Sequence[int], seq_lengths: Sequence[int]):
        self.batch_sizes: list[int] = _positive_sorted(batch_sizes, "batch size")
        self.seq_lengths: list[int] = _positive_sorted(seq_lengths, "sequence length")
        self.max_batch_size: int = self.batch_sizes[-1]
        self.max_seq_len: int = self.seq_lengths[-1]
        # Smallest first, so callers capturing graphs can warm up in a stable order.
        self.buckets: list[Bucket] = sorted(
            (Bucket(b, s) for b in self.batch_sizes for s in self.seq_lengths),
            key=lambda b: (b.tokens, b.batch_size, b.seq_len),
        )

    def choose(self, lengths: Sequence[int]) -> Bucket | None:
        """Smallest bucket covering a batch with these prompt lengths; None if none covers it
        (too many requests, a prompt too long, or an empty batch)."""
        if not lengths:
            return None
        longest = max(lengths)
        if min(lengths) < 1:
            raise ValueError(f"every sequence in a batch needs >= 1 token, got {list(lengths)}")
        b = bisect.bisect_left(self.batch_sizes, len(lengths))
        s = bisect.bisect_left(self.seq_lengths, longest)
        if b == len(self.batch_sizes) or s == len(self.seq_lengths):
            return None
        return Bucket(self.batch_sizes[b], self.seq_lengths[s])

    def __repr__(self) -> str:
        return f"BucketGrid(batch_sizes={self.batch_sizes}, seq_lengths={self.seq_lengths})"


@dataclass(frozen=True)
class SlotPlan:
    start: int     # flat offset of the slot's first real (or dummy) token
    length: int    # tokens placed in the slot
    dummy: bool    # True for padding slots beyond the real batch


@dataclass(frozen=True)
class PaddingPlan:
    bucket: Bucket
    slots: tuple[SlotPlan, ...]   # len == bucket.batch_size
    real_tokens: int
    padded_tokens: int            # bucket.batch_size * bucket.seq_len
    waste: int                    # padded_tokens - real_tokens

    def last_index(self, i: int) -> int:
        """Flat index of slot i's last token (where its logits are read)."""
        slot = self.slots[i]
        return slot.start + slot.length - 1


def plan_padding(lengths: Sequence[int], bucket: Bucket) -> PaddingPlan:
    """Right-aligned placement of a batch into `bucket` (see the module docstring)."""
    n, size, seq = len(lengths), bucket.batch_size, bucket.seq_len
    if n == 0:
        raise ValueError("cannot plan padding for an empty batch")
    if n > size:
        raise ValueError(f"batch of {n} does not fit bucket batch size {size}")
    slots = []
    for i, length in enumerate(lengths):
        if not 1 <= length <= seq:
            raise ValueError(f"sequence {i} has {length} tokens; bucket seq_len is {seq} (need 1..{seq})")
        slots.append(SlotPlan(start=i * seq + (seq - length), length=length, dummy=False))
    for i in range(n, size):
        slots.append(SlotPlan(start=i * seq + seq - 1, length=1, dummy=True))
    real = sum(lengths)
    padded = size * seq
    return PaddingPlan(bucket=bucket, slots=tuple(slots), real_tokens=real,
                       padded_tokens=padded, waste=padded - real)


# Without CUDA graphs a padded batch is only extra work; "auto" still takes a bucket whose
# padding is small, where the fixed shape costs next to nothing.
AUTO_MAX_PADDING = 1.25
BATCH_PREFILL_GRAPHS_MODES = ("auto", "always", "never")


def bucket_for_batch(grid: BucketGrid | None, queue: str | None, lengths: Sequence[int], *,
                     mode: str = "auto", graphs: bool = False,
                     cost: Callable[[Bucket | None], float] | None = None) -> Bucket | None:
    """The bucket a prefill batch runs in, or None for the packed eager path.

    Only short batches use buckets (long prompts exceed the grid by design). mode "never" and
    "always" force it. "auto": with `cost` (seconds of a path: a bucket, or None for eager),
    the cheaper path; without it, the bucket when the device replays CUDA graphs of it, or when
    the padded shape holds at most AUTO_MAX_PADDING times the real tokens. Why a cost when one is
    known: a graph saves launch overhead but its padding is real compute, which on a large model
    costs more than the launches it saves (the reference's 7B logs: 3.45x padding on average,
    lower throughput with more graph hits). One rule for the builtin engine, the emulated engine
    and the simulator; the emulated engine and the simulator know their costs from the profile."""
    if grid is None or queue != SHORT or mode == "never" or not lengths:
        return None
    bucket = grid.choose(lengths)
    if bucket is None:
        return None
    if mode == "always":
        return bucket
    if cost is not None:
        return bucket if cost(bucket) < cost(None) else None
    if graphs:
        return bucket
    return bucket if bucket.tokens <= AUTO_MAX_PADDING * sum(lengths) else None
