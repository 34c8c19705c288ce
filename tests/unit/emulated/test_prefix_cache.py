"""The emulated engine's prefix cache: LRU under a capacity, prefixes only, and prefill cost
of the uncached tokens alone."""
from __future__ import annotations

from laps_agent.emulated.core import EngineModel
from laps_agent.emulated.prefix_cache import PrefixCacheModel
from laps_agent.emulated.profile import load_profile
from laps_agent.emulated.requests import ModelRequest
from laps_agent.policy.scheduling.config import SchedulerConfig


def test_a_prompt_hits_its_longest_held_prefix_and_at_least_one_token_is_computed():
    cache = PrefixCacheModel(capacity_tokens=1600, block_tokens=16)
    cache.insert(range(0, 10))
    assert cache.cached_tokens(range(0, 20), 330) == 160
    assert cache.cached_tokens(range(0, 10), 160) == 159
    assert cache.cached_tokens([99, 1, 2], 48) == 0          # a different first page: nothing
    assert cache.cached_tokens(None, 48) == 0


def test_capacity_is_kept_by_evicting_the_least_recently_used_tails():
    cache = PrefixCacheModel(capacity_tokens=16 * 8, block_tokens=16)
    cache.insert(range(0, 5))          # a: pages 0-4
    cache.insert(range(100, 105))      # b: 10 pages > 8: a's tail goes first
    assert len(cache) == 8 and cache.evictions == 2
    assert cache.match(range(0, 5)) == 3 and cache.match(range(100, 105)) == 5
    cache.insert(range(200, 203))      # c: evicts what was used least recently (a, matched before b)
    assert cache.match(range(0, 5)) == 0
    assert cache.match(range(100, 105)) == 5 and cache.match(range(200, 203)) == 3


def test_the_engine_model_skips_cached_tokens_in_prefill_time():
    profile = load_profile("gpu-h200-qwen2.5-32b")
    sched = SchedulerConfig(wait_window_ms=0.0)
    engine = EngineModel(profile, "prefill", sched, prefix_cache=PrefixCacheModel(100_000, 16))
    engine.add(ModelRequest("a", "prefill", 2000, 1, 0.0, blocks=range(0, 125)), 0.0)
    engine.poll(0.0)
    cold = engine.busy_until
    engine.poll(cold)
    later = ModelRequest("b", "prefill", 2040, 1, cold, blocks=range(0, 127))
    engine.add(later, cold)
    assert later.cached_tokens == 2000 and later.cls == "short"
    engine.poll(cold)
    assert engine.busy_until - cold < cold / 5
