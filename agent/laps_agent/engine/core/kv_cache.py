"""Paged KV-cache bookkeeping: which pages of the runner's KV pool belong to which request.

Pure Python, no tensors: the runner owns the memory, this module only decides page ownership.
A request holds ceil(tokens / page_size) pages. Without the prefix cache no page is ever shared,
so freeing a request can never corrupt another one's cache.

With `prefix_cache=True` full pages of computed prompts stay in a radix tree (prefix_cache.py)
after their request ends, and a later request whose prompt starts with the same tokens holds
those same pages instead of recomputing them. Sharing is made safe by reference counts: every
page counts its holders (each request holding it, plus one if the tree caches it) and goes back
to the free list only at zero, so a page is never reused while anyone can still read it. Shared
pages are always full pages of a prefix, and requests only write at positions past their cached
prefix, so nobody ever writes a shared page. Cached pages nobody holds are free in every sense
that matters to callers (`free_pages` counts them): an allocation that needs them evicts the
least recently used ones first, and fails with KVCacheFull only when even that is not enough."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from laps_agent.engine.core.prefix_cache import RadixCache


class KVCacheFull(RuntimeError):
    """Not enough free pages for the requested growth; the request got nothing (unheld cached
    pages may have been evicted on the way)."""


class KVCacheError(RuntimeError):
    """Misuse (unknown request, double allocation) or a broken invariant."""


@dataclass
class _Holding:
    tokens: int
    pages: list[int] = field(default_factory=list)
    cached: int = 0  # leading tokens whose KV came from the prefix cache (a multiple of page_size)


class PagedKVAllocator:
    def __init__(self, num_pages: int, page_size: int = 16, *, prefix_cache: bool = False) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"num_pages and page_size must be positive, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        # LIFO free list: recently freed pages are reused first (warm in cache on real hardware).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._held: dict[str, _Holding] = {}
        self._ref = [0] * num_pages
        self.cache = RadixCache(page_size) if prefix_cache else None
        # Cached pages only the tree holds. Every request's cached pages form a root path of the
        # tree (RadixCache.insert swaps duplicates), so a node nobody holds has no held node
        # below it: all of these can be evicted, leaves first, and count as free.
        self._unheld_cached = 0
        self.evicted_pages = 0  # ever, for metrics

    # ---- queries ---------------------------------------------------------------------------
    def pages_for(self, tokens: int) -> int:
        return -(-max(tokens, 0) // self.page_size)

    @property
    def free_pages(self) -> int:
        """Pages an allocation can get: the free list plus cached pages no request holds."""
        return len(self._free) + self._unheld_cached

    @property
    def used_pages(self) -> int:
        """Pages requests hold (shared ones once); the evictable cache is not use."""
        return self.num_pages - self.free_pages

    @property
    def cached_pages(self) -> int:
        return len(self.cache) if self.cache is not None else 0

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def usage_ratio(self) -> float:
        return self.used_pages / self.num_pages

    def can_fit(self, tokens: int) -> bool:
        """Whether a new request of `tokens` tokens fits right now (without any cached prefix)."""
        return self.pages_for(tokens) <= self.free_pages

    def __contains__(self, rid: object) -> bool:
        return rid in self._held

    def __len__(self) -> int:
        return len(self._held)

    def pages(self, rid: str) -> list[int]:
        return list(self._holding(rid).pages)

    def pages_covering(self, rid: str, tokens: int) -> list[int]:
        """The pages of `rid` that hold its first `tokens` tokens (what a forward pass reads)."""
        return self.pages(rid)[: self.pages_for(tokens)]

    def tokens(self, rid: str) -> int:
        return self._holding(rid).tokens

    def cached_tokens(self, rid: str) -> int:
        return self._holding(rid).cached

    def requests(self) -> list[str]:
        return list(self._held)

    def holders(self, page: int) -> int:
        """How many hold `page`: the requests holding it, plus one if the prefix cache does."""
        return self._ref[page]

    def match(self, prompt: Sequence[int]) -> int:
        """Tokens of `prompt` the prefix cache holds now and a prefill could skip (read-only).
        Capped one token short of the prompt, rounded down to a page: prefill must compute at
        least the last token (its logits give the first output token), and it must start on a
        page boundary because the page holding the recomputed token is written, so not shared."""
        if self.cache is None or not prompt:
            return 0
        return len(self.cache.match(prompt, (len(prompt) - 1) // self.page_size)) * self.page_size

    # ---- changes ---------------------------------------------------------------------------
    def allocate(self, rid: str, tokens: int, prompt: Sequence[int] | None = None) -> list[int]:
        """Give a new request room for `tokens` tokens; returns its pages. With `prompt` (its
        token ids) and the prefix cache on, the pages of the longest cached prefix (see `match`)
        are shared rather than fresh; `cached_tokens(rid)` says how many tokens they hold."""
        if rid in self._held:
            raise KVCacheError(f"request {rid!r} already holds KV pages")
        if tokens < 0:
            raise ValueError(f"token count must be >= 0, got {tokens}")
        shared: list[int] = []
        if self.cache is not None and prompt:
            limit = min((len(prompt) - 1) // self.page_size, self.pages_for(tokens))
            shared = self.cache.match(prompt, limit)
        need = self.pages_for(tokens) - len(shared)
        # Taking the shared pages makes those of them nobody held unavailable for eviction.
        newly_held = sum(1 for p in shared if self._ref[p] == 1)
        if need > self.free_pages - newly_held:
            raise KVCacheFull(f"request {rid!r} needs {need} pages, {self.free_pages - newly_held} free")
        for page in shared:  # held before evicting, so eviction cannot take them
            self._incref(page)
        try:
            fresh = self._take(need)
        except KVCacheFull:
            for page in shared:
                self._decref(page)
            raise
        if self.cache is not None:
            self.cache.touch(shared)
        self._held[rid] = _Holding(tokens=tokens, pages=shared + fresh, cached=len(shared) * self.page_size)
        return shared + fresh

    def extend(self, rid: str, total_tokens: int) -> list[int]:
        """Grow a request to `total_tokens` tokens (never shrinks); returns all its pages."""
        holding = self._holding(rid)
        if total_tokens <= holding.tokens:
            return list(holding.pages)
        need = self.pages_for(total_tokens) - len(holding.pages)
        if need > self.free_pages:
            raise KVCacheFull(f"request {rid!r} needs {need} more pages, {self.free_pages} free")
        holding.pages.extend(self._take(need))
        holding.tokens = total_tokens
        return list(holding.pages)

    def insert(self, rid: str, token_ids: Sequence[int]) -> int:
        """Cache the full pages of a request's computed KV: `token_ids` are the tokens at its
        positions 0.. whose KV is written (the prompt after prefill; prompt and output but the
        last token after decoding). Returns how many pages became newly cached. No-op without
        the cache. Where another request cached the same prefix meanwhile, this request swaps
        its duplicate pages for the cached ones (same KV) and frees its own."""
        holding = self._holding(rid)
        if self.cache is None:
            return 0
        n = min(len(token_ids) // self.page_size, len(holding.pages))
        path, added = self.cache.insert(token_ids[:n * self.page_size], holding.pages[:n])
        for page in added:
            self._ref[page] += 1  # the tree's reference (the request holds it too: not evictable)
        for i, page in enumerate(path):
            if holding.pages[i] != page:
                self._incref(page)
                self._decref(holding.pages[i])
                holding.pages[i] = page
        return len(added)

    def free(self, rid: str) -> int:
        """Release everything a request holds (finish or abort). Unknown ids free nothing.
        Returns the number of pages the request held (cached ones stay in the tree)."""
        holding = self._held.pop(rid, None)
        if holding is None:
            return 0
        for page in reversed(holding.pages):
            self._decref(page)
        return len(holding.pages)

    def _take(self, n: int) -> list[int]:
        while len(self._free) < n and self.cache is not None:
            page = self.cache.evict_one(lambda p: self._ref[p] == 1)
            if page is None:
                break
            self._unheld_cached -= 1
            self._ref[page] = 0
            self._free.append(page)
            self.evicted_pages += 1
        if n > len(self._free):
            raise KVCacheFull(f"{n} pages needed, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for page in pages:
            self._ref[page] = 1
        return pages

    def _incref(self, page: int) -> None:
        if self._ref[page] == 1 and self.cache is not None and page in self.cache:
            self._unheld_cached -= 1
        self._ref[page] += 1

    def _decref(self, page: int) -> None:
        self._ref[page] -= 1
        if self._ref[page] == 0:
            self._free.append(page)
        elif self._ref[page] == 1 and self.cache is not None and page in self.cache:
            self._unheld_cached += 1
            self.cache.offer(page)

    # ---- invariants ------------------------------------------------------------------------
    def self_check(self) -> None:
        """Raise KVCacheError unless: every page's reference count is its number of holders
        (requests holding it, plus the tree if cached); the free list holds exactly the pages
        with none, once each; every request holds exactly the pages its token count needs, its
        cached pages forming a root path of the tree; the evictable count is right."""
        refs = [0] * self.num_pages
        for rid, holding in self._held.items():
            if len(holding.pages) != self.pages_for(holding.tokens):
                raise KVCacheError(
                    f"request {rid!r} holds {len(holding.pages)} pages for {holding.tokens} tokens")
            if len(set(holding.pages)) != len(holding.pages):
                raise KVCacheError(f"request {rid!r} holds a page twice")
            for page in holding.pages:
                if not 0 <= page < self.num_pages:
                    raise KVCacheError(f"request {rid!r} holds page {page}, out of range")
                refs[page] += 1
            self._check_root_path(rid, holding)
        cached = self.cache.pages() if self.cache is not None else []
        for page in cached:
            refs[page] += 1
        if sorted(self._free) != [p for p in range(self.num_pages) if refs[p] == 0]:
            raise KVCacheError("the free list is not exactly the pages nobody holds "
                               f"(free {sorted(self._free)[:10]}...)")
        if refs != self._ref:
            bad = [p for p in range(self.num_pages) if refs[p] != self._ref[p]]
            raise KVCacheError(f"reference counts wrong for pages {bad[:10]}")
        if self._unheld_cached != sum(1 for p in cached if refs[p] == 1):
            raise KVCacheError("evictable page count is wrong")
        if self.cache is not None:
            try:
                self.cache.self_check()
            except ValueError as err:
                raise KVCacheError(str(err)) from None

    def _check_root_path(self, rid: str, holding: _Holding) -> None:
        if self.cache is None:
            return
        in_tree = [p in self.cache for p in holding.pages]
        depth = in_tree.index(False) if False in in_tree else len(in_tree)
        if any(in_tree[depth:]) or (depth and self.cache.path_of(holding.pages[depth - 1]) != holding.pages[:depth]):
            raise KVCacheError(f"request {rid!r}: its cached pages are not a root path of the tree")
        if holding.cached > depth * self.page_size:
            raise KVCacheError(f"request {rid!r} claims {holding.cached} cached tokens")

    def _holding(self, rid: str) -> _Holding:
        try:
            return self._held[rid]
        except KeyError:
            raise KVCacheError(f"request {rid!r} holds no KV pages") from None
