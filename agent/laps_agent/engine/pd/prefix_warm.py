"""Prefix warming: the prefill engine computes a finished chat turn's answer into its prefix cache.

In PD serving the prefill engine computes only the prompt; the answer is generated on the decode
engine. A chat's next turn re-sends prompt + answer + a new message, so with only the prompt
cached the prefill engine still has to compute the whole previous answer (LMSYS answers: ~200
tokens, most of a later turn's work) before the first token. With `--prefix-warm`:

- the decode engine, when a request finishes, POSTs its prompt + answer token ids to the prefill
  engine that served it (`WARM_PATH` on that engine's bootstrap port: the address the KV came
  from), fire and forget;
- the prefill engine queues them at the lowest priority: a warm runs only while nothing else
  could (no prefill queued or held by the waiting window, nothing decoding or importing), in
  chunks of at most the length threshold, so a request that arrives meanwhile waits at most
  one short-batch's worth of compute; the computed pages go into the prefix cache like any
  prompt's, LRU-evicted like them;
- the next turn then finds prompt + answer cached and prefills only the new message, which
  usually makes it short work (the gateway expects that too: gateway/prefix.py).

What it costs: prefill compute for every answer, most of which the next turn would have spent
anyway (not for a conversation's last turn), done while the pod is otherwise idle. Where the
re-sent answer tokenizes differently from the generated ids, the cache match simply ends there.
Warms are dropped, never waited for: when the queue passes `MAX_QUEUED_WARMS`, when the pool has
no free page, when a forward fails.
"""
from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

WARM_PATH = "/laps/warm"
MAX_QUEUED_WARMS = 64
WARM_TIMEOUT_S = 5.0
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


def warm_body(input_ids: list[int]) -> bytes:
    return json.dumps({"input_ids": input_ids}, separators=(",", ":")).encode()


def parse_warm_body(raw: bytes, vocab_size: int, max_tokens: int) -> list[int]:
    """The ids of a warm request; ValueError with the reason if they are not usable."""
    try:
        ids = json.loads(raw).get("input_ids")
    except (ValueError, AttributeError, RecursionError):
        raise ValueError("the body must be a JSON object with input_ids") from None
    if not isinstance(ids, list) or not ids or not all(type(t) is int and 0 <= t < vocab_size for t in ids):
        raise ValueError(f"input_ids must be a non-empty list of token ids in [0, {vocab_size})")
    if len(ids) > max_tokens:
        raise ValueError(f"{len(ids)} tokens; this engine caches at most {max_tokens}")
    return ids


async def send_warm(host: str, port: int, input_ids: list[int], timeout_s: float = WARM_TIMEOUT_S) -> int:
    """POST a warm to a prefill engine's bootstrap port; returns the HTTP status (0: no answer).
    Over its own connection, as the KV fetch it shares the client with (pd_fetch.request)."""
    import httpx

    from laps_agent.engine.pd import fetch as pd_fetch
    from laps_agent.engine.pd.frame import BootstrapError

    try:
        answer = await pd_fetch.request("POST", host, port, WARM_PATH, timeout_s, body=warm_body(input_ids),
                                        content_type="application/json")
    except (httpx.HTTPError, BootstrapError) as exc:  # pd_fetch's failures: the warm is lost, no harm
        log.debug("prefix warm to %s:%d failed: %s", host, port, exc)
        return 0
    return answer.status_code
