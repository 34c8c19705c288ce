"""Paged KV-cache bookkeeping: which pages of the runner's KV pool belong to which request.

Pure Python, no tensors: the runner owns the memory, this module only decides page ownership.
A request holds ceil(tokens / page_size) pages; pages are never shared, so freeing a request
can never corrupt another one's cache."""
from __future__ import annotations

from dataclasses import dataclass, field


class KVCacheFull(RuntimeError):
    """Not enough free pages for the requested growth; nothing was changed."""


class KVCacheError(RuntimeError):
    """Misuse (unknown request, double allocation) or a broken invariant."""


@dataclass
class _Holding:
    tokens: int
    pages: list[int] = field(default_factory=list)


class PagedKVAllocator:
    def __init__(self, num_pages: int, page_size: int = 16) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"num_pages and page_size must be positive, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        # LIFO free list: recently freed pages are reused first (warm in cache on real hardware).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._held: dict[str, _Holding] = {}

    # ---- queries ---------------------------------------------------------------------------
    def pages_for(self, tokens: int) -> int:
        return -(-max(tokens, 0) // self.page_size)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def usage_ratio(self) -> float:
        return self.used_pages / self.num_pages

    def can_fit(self, tokens: int) -> bool:
        """Whether a new request of `tokens` tokens fits right now."""
        return self.pages_for(tokens) <= len(self._free)

    def __contains__(self, rid: object) -> bool:
        return rid in self._held

    def __len__(self) -> int:
        return len(self._held)

    def pages(self, rid: str) -> list[int]:
        return list(self._holding(rid).pages)

    def tokens(self, rid: str) -> int:
        return self._holding(rid).tokens

    def requests(self) -> list[str]:
        return list(self._held)

    # ---- changes ---------------------------------------------------------------------------
    def allocate(self, rid: str, tokens: int) -> list[int]:
        """Give a new request room for `tokens` tokens; returns its pages."""
        if rid in self._held:
            raise KVCacheError(f"request {rid!r} already holds KV pages")
        if tokens < 0:
            raise ValueError(f"token count must be >= 0, got {tokens}")
        need = self.pages_for(tokens)
        if need > len(self._free):
            raise KVCacheFull(f"request {rid!r} needs {need} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(need)]
        self._held[rid] = _Holding(tokens=tokens, pages=pages)
        return list(pages)

    def extend(self, rid: str, total_tokens: int) -> list[int]:
        """Grow a request to `total_tokens` tokens (never shrinks); returns all its pages."""
        holding = self._holding(rid)
        if total_tokens <= holding.tokens:
            return list(holding.pages)
        need = self.pages_for(total_tokens) - len(holding.pages)
        if need > len(self._free):
            raise KVCacheFull(f"request {rid!r} needs {need} more pages, {len(self._free)} free")
        holding.pages.extend(self._free.pop() for _ in range(need))
        holding.tokens = total_tokens
        return list(holding.pages)

    def free(self, rid: str) -> int:
        """Release everything a request holds (finish or abort). Unknown ids free nothing."""
        holding = self._held.pop(rid, None)
        if holding is None:
            return 0
        self._free.extend(reversed(holding.pages))
        return len(holding.pages)

    # ---- invariants ------------------------------------------------------------------------
    def self_check(self) -> None:
        """Raise KVCacheError unless every page is owned by exactly one of: the free list or one
        request, and every request holds exactly the pages its token count needs."""
        seen: set[int] = set()
        for page in self._free:
            if page in seen:
                raise KVCacheError(f"page {page} is twice in the free list")
            seen.add(page)
        for rid, holding in self._held.items():
            if len(holding.pages) != self.pages_for(holding.tokens):
                raise KVCacheError(
                    f"request {rid!r} holds {len(holding.pages)} pages for {holding.tokens} tokens")
            for page in holding.pages:
                if page in seen:
                    raise KVCacheError(f"page {page} is owned twice (request {rid!r})")
                seen.add(page)
        if seen != set(range(self.num_pages)):
            lost = sorted(set(range(self.num_pages)) - seen)
            raise KVCacheError(f"pages lost or out of range: {lost[:10]}")

    def _holding(self, rid: str) -> _Holding:
        try:
            return self._held[rid]
        except KeyError:
            raise KVCacheError(f"request {rid!r} holds no KV pages") from None
