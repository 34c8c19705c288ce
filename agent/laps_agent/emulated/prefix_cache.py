"""The prefix cache of one emulated engine: which prompt blocks it still holds (LRU, bounded).

A paged radix cache (the builtin engine's, SGLang's) matches a new prompt against earlier ones
page by page and keeps what it can until memory runs out, evicting the least recently used
leaves first. Here a prompt is a sequence of block keys, one per whole KV page (`block_tokens`
= the profile's page size; equal keys at position i mean equal prompts up to that page, as
chained hashes give); a request's cached tokens are the longest run of leading blocks held,
and prefill then costs only the rest (`Profile.prefill_seconds(uncached, cached)`).

Capacity: `capacity_tokens` (default the profile's whole KV pool). On a prefill pod requests
hold their KV only until the hand-off, so the cache can use nearly all of it; the model does
not take in-flight pages from the cache (a simplification: it slightly flatters hit rates at
full load). The blocks are a `BlockLRU` (laps_agent.policy.prefix_blocks), so what remains of a prompt
is always a prefix of it (as leaves go first in a radix tree).
"""
from __future__ import annotations

from typing import Sequence

from laps_agent.policy.prefix_blocks import BlockLRU


class PrefixCacheModel:
    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        if block_tokens < 1 or capacity_tokens < block_tokens:
            raise ValueError(f"a prefix cache needs block_tokens >= 1 and capacity_tokens >= "
                             f"block_tokens, got {capacity_tokens} and {block_tokens}")
        self.block_tokens = block_tokens
        self._blocks = BlockLRU(capacity_tokens // block_tokens)
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, blocks: Sequence[int]) -> int:
        """Leading blocks of `blocks` held (the radix match); touches them."""
        n = self._blocks.held(blocks)
        self._blocks.touch(blocks[:n])   # all held: nothing is evicted
        return n

    def peek(self, blocks: Sequence[int]) -> int:
        """Leading blocks of `blocks` held, touching nothing (what a router may ask)."""
        return self._blocks.held(blocks)

    def cached_tokens(self, blocks: Sequence[int] | None, prompt_tokens: int) -> int:
        """Tokens of a prompt found cached; at least one token is always computed (its logits
        give the first output token), as the builtin engine does."""
        if not blocks:
            return 0
        return max(min(self.match(blocks) * self.block_tokens, prompt_tokens - 1), 0)

    def insert(self, blocks: Sequence[int] | None) -> None:
        """The prompt's KV was computed: keep its blocks (the head most recent)."""
        if blocks:
            self.evictions += self._blocks.touch(blocks)
