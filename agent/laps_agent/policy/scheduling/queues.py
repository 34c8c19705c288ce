"""LAPS dual-queue prefill scheduler: short-first with a waiting window and a starvation bound.

Requests are classified by their *uncached* prompt tokens (what prefill really computes):
<= length_threshold is short, else long. Each call to `next_batch(now)` applies, in order:
1. Starvation bound: once the oldest long request has waited max_long_wait_ms, a long batch
   (FIFO, starting with it) goes, even if short requests wait.
2. Short requests go when the window lets them: window off, batch full (max_batch_size /
   max_prefill_tokens), target depth reached, or the oldest has waited the window (window.py).
3. While the window holds k short requests and m long ones wait, the long batch goes first iff
   k * (its expected overrun past the window) <= m * (the short batch's expected duration),
   Smith's rule; otherwise, or with no cost estimate yet (`observe_prefill`, `calibrate`), the
   window is cut and the short batch runs now: the device never idles while a long request
   waits. `long_in_window="always"`: the reference's rule (the long batch always runs).
4. Otherwise long requests if any; else, when another short arrival is expected before the
   window ends (by the mean and the last gap between short arrivals, window.py), an empty Decision with
   `wake_at` = the window's end; when none is, the short batch now: a window that cannot merge
   anything only delays.
Rule 1 is a tested guarantee: with batches of at most D seconds, a long request with k ahead of
it in its queue waits at most max_long_wait_ms + (k + 1) * D. Batches are FIFO within a class,
of at most max_batch_size requests and max_prefill_tokens uncached tokens (a long batch:
max_long_batch_tokens, so that a short request arriving behind one waits less), but the queue head
always goes (alone if over the budget, so none gets stuck). Waits count from the `now` given to
`add`; `requeue` puts back requests of the latest batch that could not start, at their queue's
head with their original wait. `enabled=False`: one FIFO queue, no window (the baseline).
Why rule 3, and the guarantee's conditions: docs/design/scheduler.md.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from laps_agent.policy.classes import LONG, SHORT, length_class
from laps_agent.policy.scheduling.buckets import BucketGrid
from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_agent.policy.scheduling.window import WaitWindow, WindowSetting

FIFO = "fifo"


@dataclass
class PrefillItem:
    rid: str
    prompt_tokens: int
    cached_tokens: int = 0
    arrival: float = 0.0              # caller's monotonic clock, seconds

    @property
    def uncached(self) -> int:
        # Prefill always computes at least the last prompt token (its logits give the first
        # output token), even when the whole prompt is in the prefix cache.
        return max(1, self.prompt_tokens - self.cached_tokens)


@dataclass
class Decision:
    batch: list[PrefillItem]          # empty: nothing to run now
    queue: str | None                 # "short" | "long" | "fifo"
    wake_at: float | None             # empty because the window holds short ones: ask again then
    reason: str                       # why this batch (for logs/metrics)


@dataclass
class _Entry:
    item: PrefillItem
    enqueued: float
    uncached: int                     # frozen at add(), so queue token counts stay consistent
    cls: str


class _Queue:
    """FIFO with O(1) removal by rid."""

    def __init__(self) -> None:
        self.entries: OrderedDict[str, _Entry] = OrderedDict()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.entries)

    def push(self, entry: _Entry) -> None:
        self.entries[entry.item.rid] = entry
        self.tokens += entry.uncached

    def remove(self, rid: str) -> _Entry | None:
        entry = self.entries.pop(rid, None)
        if entry is not None:
            self.tokens -= entry.uncached
        return entry

    def push_front(self, entry: _Entry) -> None:
        self.push(entry)
        self.entries.move_to_end(entry.item.rid, last=False)

    def head(self) -> _Entry | None:
        return next(iter(self.entries.values()), None)

    def fit(self, max_requests: int, max_tokens: int) -> tuple[int, int]:
        """How many head entries (and their tokens) the next batch would take."""
        count = tokens = 0
        for entry in self.entries.values():
            if count >= max_requests or (count > 0 and tokens + entry.uncached > max_tokens):
                break
            count += 1
            tokens += entry.uncached
        return count, tokens

    def pop(self, count: int) -> list[_Entry]:
        taken = [self.entries.popitem(last=False)[1] for _ in range(count)]
        self.tokens -= sum(e.uncached for e in taken)
        return taken


class PrefillScheduler:
    def __init__(self, config: SchedulerConfig, grid: BucketGrid | None = None):
        self.config = config
        self.grid = grid
        self.window = WaitWindow(config, grid)
        self._queues = {SHORT: _Queue(), LONG: _Queue()} if config.enabled else {FIFO: _Queue()}
        self._where: dict[str, str] = {}              # rid -> queue name
        self._by_class = {SHORT: [0, 0], LONG: [0, 0]}  # class -> [requests, uncached tokens]
        self._last_batch: dict[str, _Entry] = {}      # for requeue(): the latest dispatch only

    # -- queue maintenance -------------------------------------------------------------------
    def classify(self, uncached_tokens: int) -> str:
        return length_class(uncached_tokens, self.config.length_threshold)

    def add(self, item: PrefillItem, now: float) -> str:
        """Queue a request; returns its class ("short" | "long")."""
        if item.rid in self._where:
            raise ValueError(f"request {item.rid!r} is already queued")
        if item.prompt_tokens < 1 or item.cached_tokens < 0:
            raise ValueError(f"request {item.rid!r}: prompt_tokens must be >= 1 and cached_tokens >= 0, "
                             f"got {item.prompt_tokens} and {item.cached_tokens}")
        uncached = item.uncached
        entry = _Entry(item, now, uncached, self.classify(uncached))
        self._enqueue(entry, front=False)
        if entry.cls == SHORT and self.config.enabled:
            self.window.note_short_arrival(now, uncached)
        return entry.cls

    def requeue(self, items: list[PrefillItem], now: float) -> None:
        """Put back dispatched requests that could not start (e.g. the KV cache is full): they
        go to the head of their queue in the given order. Those from the latest batch keep their
        class and original waiting time; others count as arriving now."""
        rids = [item.rid for item in items]
        for rid in rids:
            if rid in self._where or rids.count(rid) > 1:
                raise ValueError(f"request {rid!r} is already queued")
        entries = []
        for item in items:
            old = self._last_batch.get(item.rid)
            uncached = item.uncached
            if old is None:
                entries.append(_Entry(item, now, uncached, self.classify(uncached)))
            else:
                entries.append(_Entry(item, old.enqueued, uncached, old.cls))
        for entry in reversed(entries):
            self._last_batch.pop(entry.item.rid, None)
            self._enqueue(entry, front=True)

    def _enqueue(self, entry: _Entry, front: bool) -> None:
        name = entry.cls if self.config.enabled else FIFO
        queue = self._queues[name]
        (queue.push_front if front else queue.push)(entry)
        self._where[entry.item.rid] = name
        counts = self._by_class[entry.cls]
        counts[0] += 1
        counts[1] += entry.uncached

    def abort(self, rid: str) -> bool:
        """Drop a queued request; False if it is not queued (unknown or already dispatched)."""
        name = self._where.pop(rid, None)
        if name is None:
            return False
        entry = self._queues[name].remove(rid)
        assert entry is not None
        self._uncount(entry)
        return True

    def _uncount(self, entry: _Entry) -> None:
        counts = self._by_class[entry.cls]
        counts[0] -= 1
        counts[1] -= entry.uncached

    def pending(self) -> dict[str, tuple[int, int]]:
        """class -> (requests, uncached tokens) waiting; keys "short" and "long" in both modes
        (in FIFO mode they break the single queue down by class)."""
        return {cls: (c[0], c[1]) for cls, c in self._by_class.items()}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, rid: object) -> bool:
        return rid in self._where

    def window_setting(self) -> WindowSetting:
        return self.window.setting()

    def prefill_cost(self) -> tuple[float, float] | None:
        """(overhead seconds, seconds per uncached token) of a prefill batch here, as measured so
        far (window.PrefillCostModel.linear); None before the first batch or start-up calibration."""
        return self.window.cost.linear()

    def observe_prefill(self, batch: list[PrefillItem], seconds: float) -> None:
        """Feed the cost model: a batch of these requests took `seconds` of prefill. Call it
        after every batch (also in fixed-window mode: rule 3 uses the estimate)."""
        if batch:
            self.window.observe_prefill(sum(item.uncached for item in batch), seconds)

    def calibrate(self, samples: Sequence[tuple[int, float]]) -> None:
        """Feed the cost model prefills timed at start-up, before any request ((tokens, seconds)
        each: engine/calibration.py): a fresh engine knows its speed from its first /get_load on,
        for the gateway's admission and for the window. Real batches outweigh them within
        ~1/_COST_DECAY batches."""
        for tokens, seconds in samples:
            self.window.observe_prefill(tokens, seconds)

    # -- the decision ------------------------------------------------------------------------
    def _dispatch(self, name: str, reason: str) -> Decision:
        queue = self._queues[name]
        count, _ = queue.fit(self.config.max_batch_size, self.config.batch_tokens(name))
        if name == SHORT:
            heads = [entry.uncached for entry, _ in zip(queue.entries.values(), range(count))]
            count = self.window.split_count(heads)
        taken = queue.pop(count)
        self._last_batch = {entry.item.rid: entry for entry in taken}
        for entry in taken:
            del self._where[entry.item.rid]
            self._uncount(entry)
        return Decision([e.item for e in taken], name, None, reason)

    def _long_goes_first(self, held: int, window_end: float, now: float) -> bool:
        """Exchange argument against the window's own plan (short batch at window_end, long
        batch after it): running the long batch now delays each of the `held` short requests by
        its overrun past the window, and spares each request of the long batch the wait for the
        short batch. Take the order with the smaller summed delay (Smith's rule)."""
        if self.config.long_in_window == "always":
            return True  # the reference's rule
        long_count, long_tokens = self._queues[LONG].fit(self.config.max_batch_size, self.config.batch_tokens(LONG))
        long_s = self.window.expected_seconds(long_tokens)
        short_s = self.window.expected_seconds(
            self._queues[SHORT].fit(self.config.max_batch_size, self.config.batch_tokens(SHORT))[1])
        if long_s is None or short_s is None:
            return False  # no cost estimate yet: never risk blocking short ones behind a long one
        return held * max(0.0, now + long_s - window_end) <= long_count * short_s

    def next_batch(self, now: float) -> Decision:
        if not self._where:
            return Decision([], None, None, "idle")
        if not self.config.enabled:
            return self._dispatch(FIFO, "fifo")
        short, long_ = self._queues[SHORT], self._queues[LONG]
        long_head = long_.head()
        if long_head is not None and now >= long_head.enqueued + self.config.max_long_wait_s:
            return self._dispatch(LONG, "long_starved")
        short_head = short.head()
        if short_head is None:
            return self._dispatch(LONG, "long")
        setting = self.window.setting()
        if setting.window_s <= 0:
            return self._dispatch(SHORT, "short")
        count, _ = short.fit(self.config.max_batch_size, self.config.batch_tokens(SHORT))
        if count < len(short):
            return self._dispatch(SHORT, "short_batch_full")
        if len(short) >= setting.target_depth:
            return self._dispatch(SHORT, "short_target_depth")
        window_end = short_head.enqueued + setting.window_s
        if now >= window_end:
            return self._dispatch(SHORT, "short_window_expired")
        if long_head is not None:
            if self._long_goes_first(count, window_end, now):
                return self._dispatch(LONG, "long_in_window")
            return self._dispatch(SHORT, "short_window_cut_for_long")
        if not self.window.arrival_expected_by(window_end):
            return self._dispatch(SHORT, "short_none_expected")
        return Decision([], None, window_end, "window_hold")
