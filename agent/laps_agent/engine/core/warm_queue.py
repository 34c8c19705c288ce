"""Prefix warming's queue on a prefill engine: the warms it holds and the chunk each computes next
(pd/prefix_warm.py says what warming is and carries it between engines). Torch-free and free of
I/O: the builtin engine's PD hand-off (pd_handoff.py) and the emulated engine's model drive it the
same way."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_QUEUED_WARMS = 64
# What WarmQueue reports besides "chunk" (the laps_engine_prefix_warm_total outcomes).
WARM_OUTCOMES = ("done", "dropped", "refused", "failed")


def warm_chunk(tokens: int, pos: int, cached: int, page_size: int, threshold: int) -> tuple[int, int] | None:
    """The next chunk (start, end) to compute of a warm of `tokens` tokens that has reached `pos`
    and of which the cache holds `cached` now; None when nothing is left. Only whole pages can
    be cached, so a chunk ends on a page boundary, and it is at most `threshold` tokens (at
    least a page): never more than a short batch, so it delays nothing for long."""
    full = tokens // page_size * page_size
    start = max(pos, cached)
    if full - start < page_size:
        return None
    size = max(threshold // page_size, 1) * page_size
    return start, min(full, start + size)


@dataclass(slots=True)
class Warm:
    """A finished turn to compute into the prefix cache."""
    ids: Sequence[int]        # builtin: the token ids; emulated: the KV-page keys
    tokens: int
    rid: str = ""
    pos: int = 0              # tokens warmed so far: each chunk moves it on, so a warm always ends


class WarmQueue:
    """The warms a prefill engine holds, oldest first, and the chunk each computes next; the
    builtin engine and the emulated engine's model drive it the same way when idle:
    `next_chunk` -> compute (start..end) -> `advance`, or `drop` when that cannot be done.
    `report(outcome, tokens)`: "chunk" (tokens computed) or one of WARM_OUTCOMES."""

    def __init__(self, page_size: int, threshold: int, report: Callable[[str, int], None] | None = None) -> None:
        self.page_size, self.threshold = page_size, threshold
        self.report = report or (lambda outcome, tokens: None)
        self._queue: deque[Warm] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, warm: Warm) -> None:
        self._queue.append(warm)
        while len(self._queue) > MAX_QUEUED_WARMS:  # the oldest turn is the least likely to come back
            self._queue.popleft()
            self.report("dropped", 0)

    def next_chunk(self, cached: Callable[[Warm], int]) -> tuple[Warm, int, int] | None:
        """The head warm and its next chunk (start, end), finishing warms that have none left;
        `cached(warm)`: tokens of it the cache holds now."""
        while self._queue:
            warm = self._queue[0]
            chunk = warm_chunk(warm.tokens, warm.pos, cached(warm), self.page_size, self.threshold)
            if chunk is not None:
                return warm, *chunk
            self._queue.popleft()
            self.report("done", 0)
        return None

    def advance(self, warm: Warm, end: int, computed: int) -> None:
        warm.pos = end
        self.report("chunk", computed)

    def drop(self, outcome: str) -> None:
        """The head warm cannot go on ("dropped": no room; "failed": its forward failed)."""
        self._queue.popleft()
        self.report(outcome, 0)
