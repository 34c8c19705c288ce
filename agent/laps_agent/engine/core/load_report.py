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
  max_prompt_tokens   the longest prompt it takes (context minus one): a gateway that counts a
                      prompt exactly refuses a longer one itself, as the engine would
                      (gateway/context.py), so overload elsewhere never turns it into a 429
  held_by_class       {"short": n, "long": m}: work requests it holds, from their arrival to
                      the last byte of their answer, by the class the gateway sent with them
                      (X-LAPS-Class; a request without it counts in neither). On a decode
                      engine every gateway replica's requests together: what the decode share
                      counts over all replicas
  max_pending_tokens  prefill role, from start-up on (engine/calibration.py): the uncached
                      prompt tokens it expects to prefill within QUEUE_SHARE_OF_TIMEOUT of its
                      KV hand-off timeout (--bootstrap-timeout), by its own measured cost per
                      batch and per token (scheduling/window.py's PrefillCostModel). The gateway
                      sends a request to the pod only if it fits in this with the pod's queue
                      (gateway/admission.py in_time): a token bound alone cannot know the
                      hardware, and on a slow one a queue under it still outlasts the timeout,
                      so the requests at its back fail late (503) instead of at once (429)

  prefill_cost        prefill role, once measured: {"overhead_s": a, "per_token_s": b}, its
                      batch cost seconds = a + b x uncached tokens (the same fit); the gateway
                      predicts each request's time to first token with it (policy/placement.py)
  short_pending       [requests, uncached tokens] of pending_tokens' queued short requests (by
                      the engine's own classes): the part a short request waits behind
  max_prefill_tokens  prefill role: the uncached tokens of one prefill batch at most (its
                      --max-prefill-tokens): how long a running batch can hold the pod

The figures come from the engine loop's snapshot (refreshed every iteration, and before a
prefill batch starts, so a long batch counts while it runs) plus the server's KV fetches, and
HeldByClass for the classes."""
from __future__ import annotations

from typing import Any

from laps_agent.policy.classes import SHORT
from laps_agent.serving.drain import WORK_PATHS

# The class ("short" | "long") the gateway gave a request, by the uncached length it expected
# at this pod. A header, not a body field: engines of other kinds (stock SGLang) refuse unknown
# body fields but ignore unknown headers. The engine only counts it against its own class
# (HeldByClass below, the class series of metrics.py; http/api_models.py checks its value).
LAPS_CLASS_HEADER = "X-LAPS-Class"
_HEADER = LAPS_CLASS_HEADER.lower().encode()
# A queued request's prefill must end well before its decode engine stops waiting for the KV:
# half the timeout leaves the other half for the cost estimate's error (a linear fit, while
# attention makes long prompts cost more per token; one batch's overhead counted where a queue
# runs in several) and for the hand-off itself. The timeout is the prefill engine's own; the
# decode engine's is the one that fails a request, and `laps local` and the operator give both
# engines the same.
QUEUE_SHARE_OF_TIMEOUT = 0.5


def prefill_capacity(cost: tuple[float, float] | None, seconds: float) -> int | None:
    """The uncached prompt tokens a prefill costing `cost` (overhead seconds, seconds per
    token) gets through in `seconds`, at least 1 (so an idle pod still takes a request); None
    when unknown (no cost measured yet, or no per-token cost to divide by)."""
    if cost is None or not cost[1] > 0:
        return None
    overhead, per_token = cost
    return max(1, int((seconds - overhead) / per_token))


def in_time_tokens(role: str, cost: tuple[float, float] | None, bootstrap_timeout_s: float | None) -> int | None:
    """`max_pending_tokens` (see the module docstring): what a prefill engine whose prefill costs
    `cost` (its snapshot's `prefill_cost`) expects to prefill within QUEUE_SHARE_OF_TIMEOUT of its
    hand-off timeout; None on other roles, before its cost is measured, or without a timeout.
    /get_load, /metrics (laps_engine_prefill_in_time_tokens) and `laps sim` all use this."""
    if role != "prefill" or bootstrap_timeout_s is None:
        return None
    return prefill_capacity(cost, QUEUE_SHARE_OF_TIMEOUT * bootstrap_timeout_s)


def load_report(role: str, snapshot: dict[str, Any], fetching: int,
                max_running: int | None = None,
                held_by_class: dict[str, int] | None = None,
                max_prompt_tokens: int | None = None,
                bootstrap_timeout_s: float | None = None) -> dict[str, Any]:
    queues = snapshot.get("queues") or {}
    prefilling_requests, prefilling_tokens = snapshot.get("prefilling") or (0, 0)
    report = {"role": role,
              "waiting_requests": sum(r for r, _ in queues.values()) + prefilling_requests,
              "pending_tokens": sum(t for _, t in queues.values()) + prefilling_tokens,
              "running_requests": snapshot.get("running", 0),
              "transfer_requests": snapshot.get("waiting_kv", 0) + fetching}
    if max_running is not None:
        report["max_running_requests"] = max_running
    if held_by_class is not None:
        report["held_by_class"] = dict(held_by_class)
    if max_prompt_tokens is not None:
        report["max_prompt_tokens"] = max_prompt_tokens
    cost = snapshot.get("prefill_cost")
    capacity = in_time_tokens(role, cost, bootstrap_timeout_s)
    if capacity is not None:
        report["max_pending_tokens"] = capacity
    if role == "prefill":
        if cost is not None:
            report["prefill_cost"] = {"overhead_s": cost[0], "per_token_s": cost[1]}
        report["short_pending"] = list(queues.get(SHORT, (0, 0)))
        if snapshot.get("max_prefill_tokens"):
            report["max_prefill_tokens"] = snapshot["max_prefill_tokens"]
        if snapshot.get("max_long_batch_tokens") is not None:   # 0 (its whole batch) is a value
            report["max_long_batch_tokens"] = snapshot["max_long_batch_tokens"]
    return report


class HeldByClass:
    """ASGI middleware: counts the work requests in flight per X-LAPS-Class in `held` (a dict
    with a count per class, scheduling/classes.py), from their arrival until the app has sent their last byte (streams included)
    or given up on them. An ASGI wrapper, not the route: it sees every ending (an error answer,
    a client gone mid-stream) without each path having to remember it."""

    def __init__(self, app, held: dict[str, int]) -> None:
        self.app, self.held = app, held

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] not in WORK_PATHS:
            return await self.app(scope, receive, send)
        cls = next((v.decode("latin-1") for k, v in scope["headers"] if k == _HEADER), None)
        if cls not in self.held:  # none, or a value the route answers 400
            return await self.app(scope, receive, send)
        self.held[cls] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.held[cls] -= 1
