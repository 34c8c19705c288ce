"""A bounded LRU of chained prefix-block keys: what is held of a chain is always a prefix of it.

A key stands for a whole prefix (chained hashes: equal keys at position i mean equal prompts up
to block i), and a chain is touched from its last block to its first, so no block is ever more
recent than the blocks before it in its chain. The least recently used block is therefore always
some chain's tail, and what is held of a chain stays a prefix of it (as in a radix cache, whose
leaves are evicted first): `held` is a binary search, O(log blocks) whatever the prompt's size.

Torch-free and shared: the gateway's record of what it sent to each prefill pod
(gateway/prefix.py) and the emulated engines' prefix caches (emulated/prefix_cache.py) are both
this structure; only what they count around it differs.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class BlockLRU:
    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def held(self, keys: Sequence[Hashable]) -> int:
        """How many leading keys of the chain `keys` are held; touches nothing."""
        seen = self._keys
        if not keys or keys[0] not in seen:
            return 0
        lo, hi = 1, len(keys)        # held: keys[:lo]; searching the largest such lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if keys[mid - 1] in seen:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def touch(self, keys: Sequence[Hashable]) -> int:
        """Hold the chain `keys` (its head, beyond the capacity) as the most recently used, its
        first block most of all; returns how many of the oldest blocks that evicted."""
        seen = self._keys
        for key in reversed(keys[:self.capacity_blocks]):
            seen[key] = None
            seen.move_to_end(key)
        evicted = 0
        while len(seen) > self.capacity_blocks:
            seen.popitem(last=False)
            evicted += 1
        return evicted
