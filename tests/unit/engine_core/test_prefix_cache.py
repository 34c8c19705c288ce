"""The prefix cache of the KV allocator (kv_cache.py + prefix_cache.py): shared pages, reference
counts, LRU eviction. A fake KV pool records, for every slot written, the prompt prefix whose KV it
would hold; so a page reused while someone still reads it shows up as wrong content."""
from __future__ import annotations

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from laps_agent.engine.core.kv_cache import KVCacheError, KVCacheFull, PagedKVAllocator

NUM_PAGES, PS = 20, 4
# A few conversation openings, so random prompts share prefixes often (and diverge mid-page).
BASES = [[1] * 9, [1] * 6 + [2] * 7, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], []]


class _Request:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.written = 0     # positions [0, written) hold this request's KV


class PrefixCacheMachine(RuleBasedStateMachine):
    rids = Bundle("rids")

    def __init__(self) -> None:
        super().__init__()
        self.kv = PagedKVAllocator(NUM_PAGES, PS, prefix_cache=True)
        self.pool: dict[int, list] = {p: [None] * PS for p in range(NUM_PAGES)}
        self.live: dict[str, _Request] = {}
        self.counter = 0

    def _write(self, rid: str, upto: int) -> None:
        """The runner computing positions [written, upto) of `rid`: only into pages it alone holds."""
        req = self.live[rid]
        pages = self.kv.pages(rid)
        for pos in range(req.written, upto):
            page = pages[pos // PS]
            assert self.kv.holders(page) == 1 and page not in self.kv.cache, \
                f"position {pos} of {rid} would write shared page {page}"
            self.pool[page][pos % PS] = tuple(req.ids[:pos + 1])
        req.written = max(req.written, upto)

    @rule(target=rids, base=st.sampled_from(BASES), tail=st.lists(st.integers(1, 3), max_size=14),
          extra=st.integers(0, 10), cache_prompt=st.booleans())
    def prefill(self, base, tail, extra, cache_prompt):
        ids = base + tail or [7]
        self.counter += 1
        rid = f"r{self.counter}"
        matched = self.kv.match(ids)
        free_before = self.kv.free_pages
        tokens = len(ids) + extra
        try:
            self.kv.allocate(rid, tokens, ids)
        except KVCacheFull:
            assert rid not in self.kv
            assert -(-tokens // PS) - matched // PS > free_before - matched // PS
            return rid
        cached = self.kv.cached_tokens(rid)
        event("prefix hit" if cached else "prefix miss")
        assert cached == matched and cached % PS == 0 and cached < len(ids)
        req = self.live[rid] = _Request(ids + [9] * extra)  # the "output" it will decode
        pages = self.kv.pages(rid)
        for pos in range(cached):  # what the cache handed over is the KV of this very prefix
            assert self.pool[pages[pos // PS]][pos % PS] == tuple(ids[:pos + 1])
        req.written = cached
        self._write(rid, len(ids))
        if cache_prompt:
            self.kv.insert(rid, ids)
        return rid

    @rule(rid=rids, steps=st.integers(1, 6))
    def decode(self, rid, steps):
        if rid in self.live:
            req = self.live[rid]
            self._write(rid, min(req.written + steps, self.kv.tokens(rid)))

    @rule(rid=consumes(rids), cache_all=st.booleans())
    def finish(self, rid, cache_all):
        req = self.live.pop(rid, None)
        if req is None:
            assert self.kv.free(rid) == 0
            return
        if cache_all:
            self.kv.insert(rid, req.ids[:req.written])
        held = len(self.kv.pages(rid))
        assert self.kv.free(rid) == held and rid not in self.kv

    @invariant()
    def consistent(self):
        self.kv.self_check()  # refcounts = holders, free list = unheld pages, cached = root paths
        for rid, req in self.live.items():
            pages = self.kv.pages(rid)
            for pos in range(req.written):  # nobody overwrote a page this request still reads
                assert self.pool[pages[pos // PS]][pos % PS] == tuple(req.ids[:pos + 1])
        held = {p for rid in self.live for p in self.kv.pages(rid)}
        assert self.kv.used_pages == len(held)

    def teardown(self):
        event("evicted pages" if self.kv.evicted_pages else "no eviction")
        for rid in list(self.kv.requests()):
            self.kv.free(rid)
        self.kv.self_check()
        assert self.kv.free_pages == NUM_PAGES  # nothing leaked: cached pages are all evictable
        assert self.kv.allocate("all", NUM_PAGES * PS) and self.kv.cached_pages == 0


TestPrefixCacheProperties = PrefixCacheMachine.TestCase
TestPrefixCacheProperties.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


def _prefill(kv: PagedKVAllocator, rid: str, ids: list[int], extra: int = 0) -> int:
    kv.allocate(rid, len(ids) + extra, ids)
    kv.insert(rid, ids)
    return kv.cached_tokens(rid)


def test_second_request_shares_the_full_pages_of_the_first():
    kv = PagedKVAllocator(16, 4, prefix_cache=True)
    first = list(range(1, 11))                    # 10 tokens: 2 full pages + 2 tokens
    assert _prefill(kv, "a", first) == 0
    a_pages = kv.pages("a")
    kv.free("a")
    assert kv.cached_pages == 2 and kv.free_pages == 16 and kv.used_pages == 0
    assert kv.match(first + [50, 51]) == 8
    assert _prefill(kv, "b", first + [50, 51]) == 8
    assert kv.pages("b")[:2] == a_pages[:2]
    assert kv.holders(a_pages[0]) == 2             # the tree and "b"
    kv.self_check()


def test_a_fully_cached_prompt_still_computes_its_last_page():
    kv = PagedKVAllocator(16, 4, prefix_cache=True)
    ids = list(range(1, 13))                      # exactly 3 pages
    _prefill(kv, "a", ids)
    kv.free("a")
    # The last token must be computed (its logits); its page is written, so it is not shared.
    assert kv.match(ids) == 8
    assert _prefill(kv, "b", ids) == 8
    assert kv.match(ids[:1]) == 0


def test_eviction_takes_the_least_recently_used_unheld_leaf_first():
    kv = PagedKVAllocator(4, 4, prefix_cache=True)
    old, new = [1] * 5, [2] * 5                   # one cached page each
    _prefill(kv, "old", old)
    _prefill(kv, "new", new)
    kv.free("old")
    kv.free("new")
    kv.allocate("x", 12)                          # 3 pages: 2 free, 1 evicted
    assert kv.evicted_pages == 1
    assert kv.match(new + [0]) == 4 and kv.match(old + [0]) == 0
    with pytest.raises(KVCacheFull):
        kv.allocate("y", 8)                       # one page left (the evictable "new" one)
    kv.allocate("y", 4)
    assert kv.cached_pages == 0 and kv.evicted_pages == 2
    kv.self_check()


def test_pages_held_by_a_request_are_never_evicted():
    kv = PagedKVAllocator(4, 4, prefix_cache=True)
    _prefill(kv, "a", [1] * 8)
    kv.free("a")
    kv.allocate("b", 9, [1] * 9)                  # shares both cached pages, adds one
    assert kv.cached_tokens("b") == 8 and kv.free_pages == 1
    with pytest.raises(KVCacheFull):
        kv.allocate("c", 8)
    assert kv.evicted_pages == 0 and kv.cached_pages == 2
    kv.self_check()


def test_taking_unheld_cached_pages_counts_against_what_is_free():
    kv = PagedKVAllocator(3, 4, prefix_cache=True)
    _prefill(kv, "a", [1] * 8)
    kv.free("a")                                  # 2 cached pages, unheld: 3 free in all
    # Sharing both cached pages leaves 1 page for the rest: 2 more cannot fit.
    with pytest.raises(KVCacheFull):
        kv.allocate("b", 16, [1] * 9)
    assert "b" not in kv and kv.cached_pages == 2 and kv.free_pages == 3
    kv.self_check()


def test_two_requests_computing_the_same_prefix_end_up_sharing_one_copy():
    kv = PagedKVAllocator(16, 4, prefix_cache=True)
    ids = [5] * 10
    kv.allocate("a", 10, ids)
    kv.allocate("b", 10, ids)                     # both computed it: nothing was cached yet
    kv.insert("a", ids)
    b_own = kv.pages("b")[:2]
    kv.insert("b", ids)                           # b swaps its copies for a's cached pages
    assert kv.pages("b")[:2] == kv.pages("a")[:2]
    assert all(kv.holders(p) == 0 for p in b_own)
    assert kv.free_pages == 16 - 3 - 1
    kv.self_check()


def test_without_the_cache_nothing_is_shared_or_kept():
    kv = PagedKVAllocator(8, 4)
    _prefill(kv, "a", [1] * 9)
    kv.free("a")
    assert kv.match([1] * 9) == 0 and kv.cached_pages == 0
    assert _prefill(kv, "b", [1] * 9) == 0
    kv.self_check()


def test_self_check_catches_a_freed_page_still_cached():
    kv = PagedKVAllocator(8, 4, prefix_cache=True)
    _prefill(kv, "a", [1] * 9)
    kv.free("a")
    kv._free.append(kv.cache.pages()[0])          # simulate freeing a page the tree still holds
    with pytest.raises(KVCacheError):
        kv.self_check()


def test_engine_metrics_count_hits_lookups_evictions_and_the_class_split():
    from laps_agent.engine.core.config import PrefillRecord, PrefillRequest
    from laps_agent.engine.metrics import EngineMetrics
    from tests.support.metrics_text import metric_value

    metrics = EngineMetrics("prefill", "m", None)
    metrics.observe_prefill(PrefillRecord(
        cls="short", size=2, real_tokens=60, padded_tokens=60, path="eager", bucketed=False, seconds=0.1,
        requests=[PrefillRequest(500, 480, "short", "long"), PrefillRequest(40, 0, "short", None)],
        evicted_pages=3), batch_prefill_graphs=False)
    page = metrics.render({"prefix_cache_pages": 30}).decode()
    assert metric_value(page, "laps_engine_prefix_cache_lookup_tokens_total") == 540
    assert metric_value(page, "laps_engine_prefix_cache_hit_tokens_total") == 480
    assert metric_value(page, "laps_engine_prefix_cached_tokens_count") == 2
    assert metric_value(page, "laps_engine_prefix_cache_evicted_pages_total") == 3
    assert metric_value(page, "laps_engine_prefix_cache_pages") == 30
    assert metric_value(page, "laps_engine_class_total", gateway_class="long", engine_class="short") == 1
    assert metric_value(page, "laps_engine_class_total", gateway_class="none", engine_class="short") == 1
    assert metric_value(page, "laps_engine_class_total", gateway_class="short", engine_class="long") == 0
