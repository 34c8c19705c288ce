"""Whose failure is an engine's error answer, and what the client hears (pure).

A PD request runs on two pods, and the pod that answers with an error is not always the one at
fault. A decode engine answers 504 with error type `bootstrap_error` when the KV it waits for
never came from the prefill engine within the engines' --bootstrap-timeout: the *prefill* side
is overloaded (its queue outlasted the timeout) or gone. Counting that against the decode pod
once ejected the only decode pod and turned an overloaded long group into a total outage. So it
counts against the prefill pod, is not retried (the request already waited a whole timeout, and
another attempt would add to the overload), and the client gets a 503 naming the group, marked
so that OpenAI's SDKs do not resend it either (they resend any 5xx twice by default).
Symmetrically a prefill engine's 504 `bootstrap_error` says no decode engine collected the KV:
the decode pod's failure. Both the status and the error type are checked, so a 504 from
anything else (a proxy in between, a test double) keeps meaning "this pod failed".

Two refusals are no failure at all: a 503 `draining` (the engine is shutting down gracefully,
laps_agent/serving/drain.py) takes the pod out of routing for a while without counting against it, and
a 503 `queue_full` (its queue is at its bound) leaves it as it is; both are retried on another
pod, and the client hears 503 + Retry-After only when no pod would take the request."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from laps_agent.serving.drain import DRAINING_TYPE

# Statuses that say "this pod cannot take work now", so another pod may succeed.
RETRYABLE_STATUSES = frozenset({502, 503, 504})
KV_TIMEOUT_STATUS, KV_ERROR_TYPE = 504, "bootstrap_error"
QUEUE_FULL_TYPE = "queue_full"   # an engine's queue bound (engine/server.py)


class GatewayError(Exception):
    """A request the gateway answers itself with `status` and an OpenAI-style error body."""

    def __init__(self, status: int, reason: str, message: str, retry_after: int | None = None,
                 *, no_retry: bool = False, kind: str | None = None, busy: bool = False):
        super().__init__(message)
        self.status, self.reason, self.message, self.retry_after = status, reason, message, retry_after
        self.kind = kind   # the body's error type, where it is not error_body's default
        # No pod failed: they refused it (queue full, draining) or none was left to try. An
        # overload answers that by the thousand, so it is logged at debug (a synchronous log
        # write per request on the event loop would add to the overload), not as a failure.
        self.busy = busy
        # The same request again would cost as much and end the same way: SDK clients are told
        # not to resend it on their own (errors.NO_RETRY_HEADER), as they do any 5xx.
        self.no_retry = no_retry


class Retryable(Exception):
    """An attempt failed in a way another pair of pods may not (proxy.py tries again elsewhere):
    `endpoints` are the pods to leave out, `error` what the client hears if no retry succeeds."""

    def __init__(self, endpoints: tuple[str, ...], error: GatewayError):
        super().__init__(error.message)
        self.endpoints, self.error = endpoints, error


def error_body(status: int, message: str, kind: str | None = None) -> dict:
    """OpenAI's error shape, as the gateway writes it for an error it answers itself."""
    kind = kind or ("overloaded_error" if status == 429 else
                    "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "code": status}}


class UpstreamStatus(Exception):
    """An engine refused the request itself (4xx/5xx not meaning 'try elsewhere'). `status` and
    `body` are what the client gets (relayed()): `body` is JSON whatever the engine sent."""

    def __init__(self, status: int, body: bytes, who: str = "the engine"):
        super().__init__(f"upstream answered {status}")
        self.who = who
        self.status, self.body = relayed(status, body, who)


def _text(body: bytes, limit: int = 500) -> str:
    text = body.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else text[:limit] + "..."


def relayed(status: int, body: bytes, who: str) -> tuple[int, bytes]:
    """What the client gets for `who`'s own error answer. A JSON body (the engines' OpenAI-shaped
    errors) goes as the engine wrote it. Anything else (the plain-text 500 an engine's HTTP
    server writes when its app crashed, a proxy's HTML page) is wrapped in OpenAI's shape with
    its text in the message: relayed as it was, it went out labelled application/json, and
    OpenAI clients found no message in it. A redirect is no answer to relay (its Location names
    the engine's own address): it is the gateway's 502."""
    if 300 <= status < 400:
        message = f"{who} answered {status}, a redirect, which the gateway does not follow"
        return 502, json.dumps(error_body(502, message)).encode()
    try:
        json.loads(body)
        return status, body
    except (ValueError, RecursionError):   # UnicodeDecodeError is a ValueError
        pass
    text = _text(body)
    message = f"{who} answered {status}: {text}" if text else f"{who} answered {status} with no body"
    return status, json.dumps(error_body(status, message)).encode()


@dataclass(frozen=True, slots=True)
class Blame:
    role: str           # "prefill" | "decode": the pod whose failure record counts it
    # Nothing reached the client and another pair of pods may succeed. False: resending it would
    # add to an overload, so neither the gateway nor the client's SDK does (x-should-retry: false).
    retry: bool
    status: int         # what the client gets if it is not retried (or retries run out)
    reason: str         # laps_gateway_errors_total{reason}
    message: str
    # What it says of the pod: failing (counts towards its ejection), draining (out of routing
    # for a while, no failure) or busy (nothing: it is healthy, just full).
    state: Literal["failing", "draining", "busy"] = "failing"


def engine_error(body: bytes) -> tuple[str | None, str]:
    """(type, message) of an engine's OpenAI-shaped error body; (None, "") for anything else."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None, ""
    if not isinstance(error, dict):
        return None, ""
    kind, message = error.get("type"), error.get("message")
    return (kind if isinstance(kind, str) else None), (message if isinstance(message, str) else "")


def judge_status(role: str, status: int, body: bytes, *, prefill: str, group: str,
                 decode: str) -> Blame | None:
    """`role`'s pod answered `status`/`body` for a request routed to prefill pod `prefill` of
    prefill group `group` and decode pod `decode`. None: the engine's own verdict on the request
    (a 4xx, a 500), which the client sees as it is."""
    if status not in RETRYABLE_STATUSES:
        return None
    kind, detail = engine_error(body)
    if kind is None and not detail:   # not OpenAI-shaped (a proxy's or server's text): say it
        detail = _text(body, 200)
    name = prefill if role == "prefill" else decode
    if status == 503 and kind == DRAINING_TYPE:
        return Blame(role, True, 503, "upstream_draining",
                     f"{role} pod {name} is draining (shutting down)", "draining")
    if status == 503 and kind == QUEUE_FULL_TYPE:
        return Blame(role, True, 503, "upstream_queue_full",
                     f"{role} pod {name}: {detail or 'its queue is full'}", "busy")
    detail = f": {detail}" if detail else ""
    if status == KV_TIMEOUT_STATUS and kind == KV_ERROR_TYPE:
        if role == "decode":
            return Blame("prefill", False, 503, "prefill_overloaded",
                         f"the {group} prefill group is overloaded: prefill pod {prefill} did not "
                         f"hand the KV over in time (decode pod {decode} gave up waiting{detail})")
        return Blame("decode", True, 502, "upstream_unavailable",
                     f"decode pod {decode} did not collect the KV from prefill pod {prefill} "
                     f"in time{detail}")
    return Blame(role, True, 502, "upstream_unavailable", f"{role} pod {name} answered {status}{detail}")
