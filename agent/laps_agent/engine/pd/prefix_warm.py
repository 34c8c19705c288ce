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

This module carries warms between engines (the body, the POST, its parsing); the queue and its
chunks are core/warm_queue.py, which the engine's PD hand-off (core/pd_handoff.py) drives.
"""
from __future__ import annotations

import json
import logging

import httpx

from laps_agent.engine.pd import fetch as pd_fetch
from laps_agent.engine.pd.frame import BootstrapError

log = logging.getLogger(__name__)

WARM_PATH = "/laps/warm"
WARM_TIMEOUT_S = 5.0


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
    try:
        answer = await pd_fetch.request("POST", host, port, WARM_PATH, timeout_s, body=warm_body(input_ids),
                                        content_type="application/json")
    except (httpx.HTTPError, BootstrapError) as exc:  # pd_fetch's failures: the warm is lost, no harm
        log.debug("prefix warm to %s:%d failed: %s", host, port, exc)
        return 0
    return answer.status_code
