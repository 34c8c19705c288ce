from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from laps_agent.engine.core.kv_cache import KVCacheError, KVCacheFull, PagedKVAllocator

NUM_PAGES, PAGE_SIZE = 24, 4


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate / extend / finish / abort sequences against a model of what each request
    should hold."""

    rids = Bundle("rids")

    def __init__(self) -> None:
        super().__init__()
        self.kv = PagedKVAllocator(NUM_PAGES, PAGE_SIZE)
        self.expected_tokens: dict[str, int] = {}
        self.counter = 0

    @rule(target=rids, tokens=st.integers(0, NUM_PAGES * PAGE_SIZE + 8))
    def allocate(self, tokens: int):
        self.counter += 1
        rid = f"r{self.counter}"
        free_before = self.kv.free_pages
        try:
            pages = self.kv.allocate(rid, tokens)
        except KVCacheFull:
            assert -(-tokens // PAGE_SIZE) > free_before
            assert self.kv.free_pages == free_before and rid not in self.kv
            return rid
        assert len(pages) * PAGE_SIZE >= tokens
        self.expected_tokens[rid] = tokens
        return rid

    @rule(rid=rids, grow=st.integers(0, 40))
    def extend(self, rid: str, grow: int):
        if rid not in self.expected_tokens:
            with pytest.raises(KVCacheError):
                self.kv.extend(rid, grow)
            return
        before = self.kv.pages(rid)
        target = self.expected_tokens[rid] + grow
        try:
            after = self.kv.extend(rid, target)
        except KVCacheFull:
            assert self.kv.pages(rid) == before
            return
        assert after[: len(before)] == before  # existing pages never move
        self.expected_tokens[rid] = target

    @rule(rid=consumes(rids))
    def finish_or_abort(self, rid: str):
        held = len(self.kv.pages(rid)) if rid in self.kv else 0
        free_before = self.kv.free_pages
        assert self.kv.free(rid) == held
        assert self.kv.free_pages == free_before + held
        assert rid not in self.kv
        self.expected_tokens.pop(rid, None)

    @invariant()
    def consistent(self):
        self.kv.self_check()
        owned = [p for rid in self.kv.requests() for p in self.kv.pages(rid)]
        assert len(owned) == len(set(owned)), "a page is owned by two requests"
        assert self.kv.free_pages + len(owned) == NUM_PAGES
        assert self.kv.usage_ratio() == pytest.approx(len(owned) / NUM_PAGES)
        for rid, tokens in self.expected_tokens.items():
            assert self.kv.tokens(rid) == tokens
            assert len(self.kv.pages(rid)) == -(-tokens // PAGE_SIZE)

    def teardown(self):
        for rid in list(self.kv.requests()):
            self.kv.free(rid)
        assert self.kv.free_pages == NUM_PAGES


TestAllocatorProperties = AllocatorMachine.TestCase
TestAllocatorProperties.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_full_pool_refuses_without_side_effects():
    kv = PagedKVAllocator(4, 16)
    kv.allocate("a", 48)
    with pytest.raises(KVCacheFull):
        kv.allocate("b", 17)
    assert kv.free_pages == 1 and "b" not in kv
    kv.allocate("b", 16)
    assert kv.usage_ratio() == 1.0
    kv.free("a")
    assert kv.free_pages == 3
    kv.self_check()


def test_double_allocation_and_unknown_request_are_errors():
    kv = PagedKVAllocator(4, 16)
    kv.allocate("a", 1)
    with pytest.raises(KVCacheError):
        kv.allocate("a", 1)
    with pytest.raises(KVCacheError):
        kv.pages("nope")
    assert kv.free("nope") == 0


def test_self_check_detects_corruption():
    kv = PagedKVAllocator(4, 16)
    kv.allocate("a", 20)
    kv._free.append(kv.pages("a")[0])  # simulate a double free bug
    with pytest.raises(KVCacheError):
        kv.self_check()
