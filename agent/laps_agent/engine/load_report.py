"""`GET /get_load`: what an engine holds right now, as small JSON that is cheap to serve and to
poll (SGLang's servers have a route of the same name; this shape is laps'). Every gateway replica
polls it (gateway/engine_load.py), so that several of them route by the engines' own queues
rather than each by the requests it dispatched itself.

  role                "prefill" | "decode" | "mixed"
  waiting_requests    requests not yet prefilled: queued, or in the prefill batch running now
  pending_tokens      their uncached prompt tokens
  running_requests    requests decoding
  transfer_requests   decode role: requests waiting for their KV (being fetched from a prefill
                      engine, or arrived and waiting for KV pages)
  max_running_requests  requests it decodes at once (its slots): the gateway bounds each
                      class's share of the decode pool by it (gateway/admission.py)

The figures come from the engine loop's snapshot (refreshed every iteration, and before a
prefill batch starts, so a long batch counts while it runs) plus the server's KV fetches."""
from __future__ import annotations

from typing import Any


def load_report(role: str, snapshot: dict[str, Any], fetching: int,
                max_running: int | None = None) -> dict[str, Any]:
    queues = snapshot.get("queues") or {}
    prefilling_requests, prefilling_tokens = snapshot.get("prefilling") or (0, 0)
    report = {"role": role,
              "waiting_requests": sum(r for r, _ in queues.values()) + prefilling_requests,
              "pending_tokens": sum(t for _, t in queues.values()) + prefilling_tokens,
              "running_requests": snapshot.get("running", 0),
              "transfer_requests": snapshot.get("waiting_kv", 0) + fetching}
    if max_running is not None:
        report["max_running_requests"] = max_running
    return report
