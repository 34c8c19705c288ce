"""Radix tree over the paged KV pool: which token prefixes already have their KV in which pages.

Page-granular: every node stands for one *full* page of tokens (its key is that page's token
ids, its value the pool page holding their KV), so a path from the root is a cached prefix whose
length is a multiple of the page size. Partial pages are never cached: the request owning one
still writes into it (its next prompt or decode tokens), and a page someone writes cannot be
shared. One node per page (rather than edges compressed over several pages) keeps eviction
page-granular too: the LRU leaf goes, one page at a time, and its parent may follow.

Pure Python and no tensors, like kv_cache.py: the runner owns the memory. Reference counts live
in the allocator (kv_cache.py), which owns page ownership; this module only knows structure and
recency. The allocator tells it when a cached page stops being held by any request (`offer`),
and asks for victims (`evict_one`) with a predicate saying which pages nobody holds."""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Sequence


class _Node:
    __slots__ = ("key", "page", "parent", "children", "stamp")

    def __init__(self, key: tuple[int, ...], page: int, parent: _Node | None) -> None:
        self.key, self.page, self.parent = key, page, parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.stamp = 0  # logical time of the last use (match, insert, release)


class RadixCache:
    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self._root = _Node((), -1, None)
        self._by_page: dict[int, _Node] = {}
        # A logical clock, not wall time: deterministic order in tests, no clock reads.
        self._clock = itertools.count(1)
        # Eviction candidates as a lazy min-heap of (stamp, tiebreak, node): entries go stale when
        # a node is used again, gains a child or is evicted, and are checked when popped. Cheaper
        # than keeping an exact ordered set in step with every lock and unlock, and than scanning
        # the whole tree on every eviction (GPU pools hold ~1e5 pages).
        self._heap: list[tuple[int, int, _Node]] = []
        self._tiebreak = itertools.count()

    def __len__(self) -> int:
        return len(self._by_page)

    def __contains__(self, page: object) -> bool:
        return page in self._by_page

    def pages(self) -> list[int]:
        return list(self._by_page)

    def _key(self, ids: Sequence[int], i: int) -> tuple[int, ...]:
        return tuple(ids[i * self.page_size:(i + 1) * self.page_size])

    # ---- lookups ---------------------------------------------------------------------------
    def match(self, ids: Sequence[int], max_pages: int | None = None) -> list[int]:
        """Pages of the longest cached prefix of `ids` (at most `max_pages` pages). Read-only:
        recency changes only when a request actually takes the pages (`touch`)."""
        limit = len(ids) // self.page_size
        if max_pages is not None:
            limit = min(limit, max_pages)
        node, pages = self._root, []
        for i in range(limit):
            node = node.children.get(self._key(ids, i))
            if node is None:
                break
            pages.append(node.page)
        return pages

    def touch(self, pages: Sequence[int]) -> None:
        stamp = next(self._clock)
        for page in pages:
            node = self._by_page.get(page)
            if node is not None:
                node.stamp = stamp

    # ---- changes ---------------------------------------------------------------------------
    def insert(self, ids: Sequence[int], pages: Sequence[int]) -> tuple[list[int], list[int]]:
        """Cache a sequence whose page i holds tokens ids[i*P:(i+1)*P] (full pages only: the
        caller passes as many pages as `ids` fills). Returns (path, added): the tree's page for
        each of them and those of the caller's pages that became new nodes.

        Where a node already exists with another page (two requests computed the same prefix
        at once), the existing page wins: it holds the same tokens at the same positions, so
        the same KV; the caller swaps its copy for it, which keeps every request's cached
        pages a root path of the tree (the allocator's eviction accounting relies on that)."""
        n = min(len(ids) // self.page_size, len(pages))
        stamp = next(self._clock)
        node, path, added = self._root, [], []
        for i in range(n):
            key = self._key(ids, i)
            child = node.children.get(key)
            if child is None:
                if pages[i] in self._by_page:  # a page can be one node only
                    raise ValueError(f"page {pages[i]} is already cached under another prefix")
                child = _Node(key, pages[i], node)
                node.children[key] = child
                self._by_page[pages[i]] = child
                added.append(pages[i])
            child.stamp = stamp
            path.append(child.page)
            node = child
        return path, added

    def offer(self, page: int) -> None:
        """The allocator's news that nobody but the tree holds `page` any more: it may be evicted
        once it is a leaf (a node with children is the prefix of cached pages that need it)."""
        node = self._by_page.get(page)
        if node is None or node.children:
            return
        node.stamp = next(self._clock)
        self._push(node)

    def evict_one(self, evictable: Callable[[int], bool]) -> int | None:
        """Remove the least recently used leaf whose page `evictable` allows; returns its page
        (the caller drops the tree's reference) or None when no leaf qualifies."""
        while self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if self._by_page.get(node.page) is not node or node.children or not evictable(node.page):
                continue  # stale: evicted already, gained a child, or held by a request again
            if stamp != node.stamp:
                self._push(node)  # used since it was queued: back in line at its real age
                continue
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            del self._by_page[node.page]
            if parent is not self._root and not parent.children and evictable(parent.page):
                self._push(parent)
            return node.page
        return None

    def _push(self, node: _Node) -> None:
        heapq.heappush(self._heap, (node.stamp, next(self._tiebreak), node))
        # Stale entries pile up while nothing is evicted: rebuild from the leaves now and then.
        if len(self._heap) > 2 * len(self._by_page) + 64:
            self._heap = [(n.stamp, next(self._tiebreak), n) for n in self._by_page.values()
                          if not n.children]
            heapq.heapify(self._heap)

    # ---- invariants ------------------------------------------------------------------------
    def path_of(self, page: int) -> list[int]:
        """Pages from the root down to `page`'s node (inclusive); [] if it is not cached."""
        node = self._by_page.get(page)
        path = []
        while node is not None and node is not self._root:
            path.append(node.page)
            node = node.parent
        return path[::-1]

    def self_check(self) -> None:
        """Raise ValueError unless the nodes reachable from the root are exactly the indexed
        ones, each under its own key."""
        seen: dict[int, _Node] = {}
        stack = [self._root]
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                if child.key != key or child.parent is not node or len(key) != self.page_size:
                    raise ValueError(f"node of page {child.page} is misfiled")
                if child.page in seen:
                    raise ValueError(f"page {child.page} is in the tree twice")
                seen[child.page] = child
                stack.append(child)
        if seen.keys() != self._by_page.keys() or any(self._by_page[p] is not n for p, n in seen.items()):
            raise ValueError("page index and tree disagree")
