"""A model of SGLang's router `cache_aware` policy (sgl-router / sgl-model-gateway), pure.

The rule, as the router's source states it (policies/cache_aware.rs, the comment at its top and
`select_worker`), over the prefill workers:
- the load of a worker is its number of pending requests; the workers are *imbalanced* when both
  (max - min) > balance_abs_threshold and max > balance_rel_threshold x min;
- imbalanced: the least-loaded worker (the first of them in list order);
- balanced: the worker whose approximate prefix tree (the router's record of the text it sent
  each worker) matches the longest prefix of the request; if the match covers more than
  cache_threshold of the prompt, that worker, else the worker with the smallest tree (the one
  it sent the least text: "most available cache capacity");
- either way the request is then added to the chosen worker's tree (the caller's record).
Defaults of the sgl-router this models: cache_threshold 0.5, balance_abs_threshold 32,
balance_rel_threshold 1.0001 (newer sgl-model-gateway documentation lists 0.3, 64 and 1.5:
pass a `CacheAwareConfig` to model those). Not modelled: the tree's eviction every
eviction_interval_secs down to max_tree_size (2**26 characters per worker by default; the
record here is bounded by the pod's KV capacity instead), and text vs tokens (the match is in
tokens of whole blocks, policy/prefix_blocks.py).

No length classes, no admission control: the router queues without limit.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from laps_agent.policy.routing import Endpoint, EndpointLoad

_IDLE = EndpointLoad()


@dataclass(frozen=True, slots=True)
class CacheAwareConfig:
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.0001


DEFAULT_CACHE_AWARE = CacheAwareConfig()


@dataclass(frozen=True, slots=True)
class CacheAwareChoice:
    endpoint: Endpoint
    matched: int          # prompt tokens the chosen worker's tree matches
    balanced: bool        # the loads were balanced (the prefix rule applied)


def imbalanced(loads: Sequence[int], config: CacheAwareConfig = DEFAULT_CACHE_AWARE) -> bool:
    if not loads:
        return False
    hi, lo = max(loads), min(loads)
    return hi - lo > config.balance_abs_threshold and hi > lo * config.balance_rel_threshold


def cache_aware_choice(tokens: int, endpoints: Sequence[Endpoint], load: Mapping[str, EndpointLoad],
                       matched: Callable[[Endpoint], int], tree_size: Callable[[Endpoint], int],
                       config: CacheAwareConfig = DEFAULT_CACHE_AWARE) -> CacheAwareChoice | None:
    """The prefill worker for a `tokens`-token prompt; `matched(ep)`: the prompt tokens ep's tree
    matches, `tree_size(ep)`: the size of ep's tree. Unhealthy workers are skipped (the router's
    healthy workers); None when none is healthy."""
    healthy = [ep for ep in endpoints if load.get(ep.name, _IDLE).healthy]
    if not healthy:
        return None
    pending = [load.get(ep.name, _IDLE).pending_requests for ep in healthy]
    if imbalanced(pending, config):
        least = min(range(len(healthy)), key=pending.__getitem__)
        return CacheAwareChoice(healthy[least], matched(healthy[least]), False)
    best, best_matched = healthy[0], -1
    for ep in healthy:
        got = matched(ep)
        if got > best_matched:
            best, best_matched = ep, got
    if tokens > 0 and best_matched / tokens > config.cache_threshold:
        return CacheAwareChoice(best, best_matched, True)
    sizes = [tree_size(ep) for ep in healthy]
    smallest = min(range(len(healthy)), key=sizes.__getitem__)
    return CacheAwareChoice(healthy[smallest], matched(healthy[smallest]), True)
