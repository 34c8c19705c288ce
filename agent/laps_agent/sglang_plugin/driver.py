"""SGLang-agnostic half of the plugin: keeps `laps_agent.policy.scheduling.PrefillScheduler` in step
with SGLang's `waiting_queue` and turns its decisions into the subset SGLang should batch.

Why a mirror rather than a replacement: SGLang's abort handling, retraction, metrics and the
PD bootstrap all read and write `scheduler.waiting_queue` directly. So `waiting_queue` stays the
source of truth for *which* requests wait (the union of both LAPS queues) and this driver only
decides *which of them go next*:

* `sync(waiting, now)`: requests new in `waiting` are classified (by uncached prompt tokens,
  as told by the caller's prefix-cache lookup) and added; tracked ones that left `waiting`
  (aborted, finished, moved by SGLang) are dropped from the LAPS queues.
* `choose(now)`: the policy's next batch as request objects, or None (nothing to run now;
  `wake_at` says when the window ends).
* `settle(chosen, leftover, now)`: after SGLang built its batch from `chosen`, the requests it
  could not admit (memory, token budget) go back to the head of their queue with their
  original waiting time (`PrefillScheduler.requeue`).

Request objects only need `.rid`; everything else comes through the callables the SGLang half
passes in, so the unit tests drive this class with plain stand-ins.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from laps_agent.policy.classes import SHORT
from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_agent.policy.scheduling.queues import Decision, PrefillItem, PrefillScheduler


@dataclass
class Tracked:
    req: Any
    cls: str
    arrival: float       # when it joined the waiting queue (the driver's clock)
    uncached: int


class QueueDriver:
    def __init__(self, config: SchedulerConfig,
                 token_counts: Callable[[Any], tuple[int, int]],
                 arrival: Callable[[Any], float] | None = None) -> None:
        """`token_counts(req)` -> (prompt tokens, cached prefix tokens); `arrival(req)` -> when
        the request reached the server, on the clock of `now` (default: when first seen here).
        Waiting times (window, starvation bound, TTFT) count from the arrival, not from when
        SGLang moved the request into `waiting_queue`: on a PD prefill server requests join
        it only once their decode peer has answered, often many at once after a long batch."""
        self.config = config
        self.policy = PrefillScheduler(config)
        self._token_counts = token_counts
        self._arrival = arrival
        self.tracked: dict[str, Tracked] = {}     # waiting, in the LAPS queues
        self.inflight: dict[str, Tracked] = {}    # chosen and admitted: their prefill runs
        self.last_decision: Decision | None = None

    # -- membership ------------------------------------------------------------------------
    def sync(self, waiting: Iterable[Any], now: float) -> None:
        waiting = list(waiting)
        present = {req.rid for req in waiting}
        for rid in [rid for rid in self.tracked if rid not in present]:
            self.policy.abort(rid)
            del self.tracked[rid]
        for req in waiting:
            # SGLang put a dispatched request back (its requeue paths): it waits again, so it
            # must be tracked again, or the union written back would lose it.
            self.inflight.pop(req.rid, None)
        fresh = [req for req in waiting if req.rid not in self.tracked]
        if self._arrival is not None:  # FIFO within a class means by arrival
            fresh.sort(key=self._arrival)
        for req in fresh:
            prompt, cached = self._token_counts(req)
            arrived = now if self._arrival is None else min(self._arrival(req), now)
            item = PrefillItem(req.rid, max(1, prompt), max(0, min(cached, prompt - 1)), arrived)
            cls = self.policy.add(item, arrived)
            self.tracked[req.rid] = Tracked(req, cls, arrived, item.uncached)

    def union(self) -> list[Any]:
        """The waiting requests in LAPS order (short queue, then long): what `waiting_queue`
        holds between two decisions."""
        order = sorted(self.tracked.values(), key=lambda t: (t.cls != SHORT, t.arrival))
        return [t.req for t in order]

    # -- decisions -------------------------------------------------------------------------
    def choose(self, now: float) -> list[Any] | None:
        decision = self.policy.next_batch(now)
        self.last_decision = decision
        if not decision.batch:
            return None
        chosen = []
        for item in decision.batch:
            tracked = self.tracked.pop(item.rid)
            self.inflight[item.rid] = tracked
            chosen.append(tracked.req)
        return chosen

    def take(self, rids: list[str]) -> list[Any] | None:
        """Apply a choice made elsewhere (tensor-parallel rank 0) to this mirror."""
        chosen = []
        for rid in rids:
            tracked = self.tracked.pop(rid, None)
            if tracked is not None:
                self.policy.abort(rid)
                self.inflight[rid] = tracked
                chosen.append(tracked.req)
        return chosen or None

    def settle(self, chosen: list[Any], leftover: Iterable[Any], now: float) -> list[Any]:
        """Requeue what SGLang left of `chosen`; returns the admitted requests (in order)."""
        left = {req.rid for req in leftover}
        back = [req for req in chosen if req.rid in left]
        if back:
            items = []
            for req in back:
                tracked = self.inflight.pop(req.rid)
                self.tracked[req.rid] = tracked
                items.append(PrefillItem(req.rid, tracked.uncached, 0, tracked.arrival))
            self.policy.requeue(items, now)
        return [req for req in chosen if req.rid not in left]

    def finish(self, rid: str) -> Tracked | None:
        """The prefill of `rid` is done (or it was dropped): forget it, return what we knew."""
        return self.inflight.pop(rid, None)

    def observe_prefill(self, rids: list[str], seconds: float) -> None:
        items = [PrefillItem(rid, self.inflight[rid].uncached) for rid in rids if rid in self.inflight]
        self.policy.observe_prefill(items, seconds)

    def pending(self) -> dict[str, tuple[int, int]]:
        return self.policy.pending()
