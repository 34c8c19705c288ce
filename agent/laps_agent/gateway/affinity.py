"""The gateway's side of cache affinity: what it remembers sending where, and what the engines
say they really found cached.

routing.py decides (pure); this keeps the `PrefixRecord` (gateway/prefix.py) the decision reads,
records a chain when it is sent to a prefill pod, and compares the gateway's class with the
class the engine saw: the engine's answer carries `cached_tokens` (OpenAI
`usage.prompt_tokens_details.cached_tokens`, SGLang `meta_info.cached_tokens`) next to
`prompt_tokens`; the engine's class is `length_class(prompt_tokens - cached_tokens)`.

Only bodies the gateway reads whole anyway are looked at (the prefill pod's answer, a
non-streaming decode answer), and only their tail, by a bytes search, not a JSON parse: a
streamed answer passes through untouched (its usage chunk is never parsed here).
"""
from __future__ import annotations

import re
from typing import Callable

from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.prefix import PrefixChain, PrefixRecord
from laps_agent.policy.classes import length_class
from laps_agent.policy.routing import Endpoint, RouteDecision

# Usage sits at the end of an answer; a prefill pod's answer is a few hundred bytes.
_TAIL_BYTES = 4096
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


def reported_split(body: bytes) -> tuple[int, int] | None:
    """(prompt tokens, cached tokens) an engine's answer reports, or None if it does not say
    how many were cached. The last occurrence counts (a stream's final usage chunk)."""
    tail = body[-_TAIL_BYTES:]
    cached = _CACHED.findall(tail)
    prompt = _PROMPT.findall(tail)
    if not cached or not prompt:
        return None
    return int(prompt[-1]), int(cached[-1])


class CacheAffinity:
    def __init__(self, record: PrefixRecord | None, threshold: int, metrics: GatewayMetrics) -> None:
        self.record, self._threshold, self._metrics = record, threshold, metrics
        self._membership: object | None = None

    def follow(self, membership) -> None:
        """Forget what departed prefill pods held: one that comes back (a new pod, an empty
        cache) must not attract its old conversations. A pod moving between the groups keeps
        its record, as its engine keeps its cache. Discovery replaces the membership object on
        every change, so an unchanged one costs one comparison."""
        if self.record is None or membership is self._membership:
            return
        self._membership = membership
        present = {e.name for pods in membership.groups.values() for e in pods}
        for pod in self.record.pods() - present:
            self.record.forget(pod)

    def held(self, chain: PrefixChain | None) -> Callable[[Endpoint], int] | None:
        """The routing policy's `held` for this request; None: classes by the full length."""
        if self.record is None:
            return None
        record = self.record
        if not chain:
            return lambda ep: 0
        return lambda ep: record.held(ep.name, chain)

    def routed(self, d: RouteDecision) -> None:
        if self.record is not None:
            self._metrics.affinity_of["hit" if d.cached > 0 else "miss"].inc()
            self._metrics.expected_cached_tokens.inc(d.cached)

    def sent(self, d: RouteDecision, chain: PrefixChain | None) -> None:
        """The prompt goes to this prefill pod, which will hold it. Recorded at dispatch (as
        SGLang's cache-aware router inserts at routing time), not on the pod's answer: a
        request that shares the prefix and comes meanwhile follows it there, and the record
        never lags the client's next turn. A failed attempt over-predicts for its chain only."""
        if self.record is not None:
            self.record.record(d.prefill.name, chain)

    def engine_answer(self, d: RouteDecision, body: bytes) -> bool:
        """Count the gateway's class against the engine's for an answer that reports its cached
        tokens; False if it does not (then another answer of the request may)."""
        split = reported_split(body)
        if split is None:
            return False
        prompt, cached = split
        engine_cls = length_class(max(prompt - cached, 1), self._threshold)
        self._metrics.class_checks_of[d.cls, engine_cls].inc()
        if engine_cls != d.cls:
            self._metrics.class_disagreements_of[d.cls, engine_cls].inc()
        return True
