"""Prefixes in the simulator: the engines' prefix caches and the gateway's record of them.

A conversation's token sequence only grows from turn to turn, so its KV page j is the same in
every turn that reaches it: page j of conversation c gets the key c * 2**24 + j (what chained
page hashes give a real engine), a prompt's pages are `range`s of keys (no per-request lists),
and a single request (conversation -1) shares nothing. Every prefill engine gets a
`PrefixCacheModel` of the profile's KV capacity; the gateway side is the gateway's own
`PrefixRecord` fed with the same pages, recorded when a request is sent (as the gateway does), so
routing (`choose_route`'s `held`) sees what the real gateway would: what it sent where, not
the engines' caches. With `affinity` off the record is not kept and classes go by full length.

`oracle` (the `laps-oracle` system of `laps sim`, a reference): one cache of unlimited capacity
shared by every prefill pod, and a router that knows it, so every pod holds every earlier turn
(what `workload.conversations.oracle_cached_tokens` counts: the hit rate no router can beat) and
routing goes by load alone. Its TTFT shows what caching gives on a workload; it is not a strict
bound (routing by load is not optimal either). It exists only in the simulator.
"""
from __future__ import annotations

from collections.abc import Callable

from laps_agent.emulated.prefix_cache import PrefixCacheModel
from laps_agent.emulated.profile import Profile
from laps_agent.gateway.prefix import PrefixChain, PrefixRecord
from laps_agent.policy.routing import Endpoint

_PAGES_PER_CONVERSATION = 2 ** 24
_UNLIMITED_TOKENS = 2 ** 50


class SimPrefixes:
    def __init__(self, profile: Profile, prefill: int, *, affinity: bool, cache_tokens: int | None = None,
                 oracle: bool = False, tree: bool = False) -> None:
        self.block_tokens = profile.engine.page_size
        self.oracle = None
        self.tree: PrefixRecord | None = None
        if oracle:
            self.oracle = PrefixCacheModel(_UNLIMITED_TOKENS, self.block_tokens)
            self.caches: list[PrefixCacheModel | None] = [self.oracle] * prefill
            self.record = None
            return
        capacity = profile.engine.kv_capacity_tokens if cache_tokens is None else cache_tokens
        self.caches = ([PrefixCacheModel(capacity, self.block_tokens) for _ in range(prefill)]
                       if capacity >= self.block_tokens else [None] * prefill)
        # The gateway remembers as many pages per pod as a pod's cache holds.
        self.record = PrefixRecord(max(1, capacity // self.block_tokens)) if affinity else None
        # `tree`: SGLang's cache_aware router (`sglang-cache-aware`): its approximate trees are the
        # same kind of record (what it sent each pod), consulted by its own rule, not `held`.
        if tree:
            self.tree = PrefixRecord(max(1, capacity // self.block_tokens))

    def blocks(self, conversation: int, prompt_tokens: int) -> range | None:
        if conversation < 0:
            return None
        base = conversation * _PAGES_PER_CONVERSATION
        return range(base, base + prompt_tokens // self.block_tokens)

    def chain(self, conversation: int, prompt_tokens: int) -> PrefixChain | None:
        blocks = self.blocks(conversation, prompt_tokens)
        if not blocks:
            return None
        b = self.block_tokens
        # range is a read-only sequence: the record indexes, slices and reverses it as a tuple.
        return PrefixChain(blocks, range(b, b * (len(blocks) + 1), b))  # type: ignore[arg-type]

    def held(self, conversation: int, prompt_tokens: int) -> Callable[[Endpoint], int] | None:
        """The routing policy's `held` (None: no affinity)."""
        if self.oracle is not None:  # every pod holds what the shared cache holds
            blocks = self.blocks(conversation, prompt_tokens)
            cached = min(self.oracle.peek(blocks) * self.block_tokens, prompt_tokens - 1) if blocks else 0
            return lambda ep: cached
        record = self.record
        if record is None:
            return None
        chain = self.chain(conversation, prompt_tokens)
        if chain is None:
            return lambda ep: 0
        return lambda ep: record.held(ep.name, chain)

    def sent(self, pod: str, conversation: int, prompt_tokens: int) -> None:
        if self.record is not None:
            self.record.record(pod, self.chain(conversation, prompt_tokens))
        if self.tree is not None:
            self.tree.record(pod, self.chain(conversation, prompt_tokens))

    def matched(self, conversation: int, prompt_tokens: int) -> Callable[[Endpoint], int]:
        """The cache_aware router's prefix match per pod, in tokens (its tree: `tree`)."""
        tree, chain = self.tree, self.chain(conversation, prompt_tokens)
        if tree is None or chain is None:
            return lambda ep: 0
        return lambda ep: tree.held(ep.name, chain)
