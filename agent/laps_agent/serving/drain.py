"""Graceful drain of one serving process (an engine or the gateway).

On the first SIGTERM or SIGINT the process turns unready at once (its /health answers 503),
answers new work with 503 + error type `draining`, finishes what it holds (streams included)
and exits when it holds nothing more, or when its grace period runs out (what is still running
then is cancelled). A second signal exits at once.

What is cut short (a second signal, or the end of the grace period) still gets a clean end from
DrainGuard rather than uvicorn's plain-text 500 and a traceback per request: a 503 `draining`
answer in the OpenAI shape before the response began, or a closing SSE error event in a stream.
The exit status says which stop it was: 0 after a drain (the grace period's end included: the
stop the operator configured), 128 + the signal's number after a second signal (the shell's
convention for "interrupted", 130 for a second Ctrl-C).

Why the listener stays open while draining, rather than closing at once: between SIGTERM and
the moment every Service and gateway stopped routing to the pod, requests still arrive. A fast
503 that says `draining` is retried elsewhere by the gateway without counting as a pod failure
(gateway/failures.py), and tells any other client what happened; a refused connection would
look like a dead pod. On Kubernetes a preStop delay (operator builders) makes that window
small: the pod keeps serving normally until the endpoints controllers took it out."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass, field

import uvicorn

log = logging.getLogger(__name__)

DRAINING_TYPE = "draining"           # the error type of a refusal; gateway/failures.py keys on it
DEFAULT_GRACE_S = 30.0               # Kubernetes' default terminationGracePeriodSeconds
# Kept from the grace period for uvicorn's own shutdown after the drain (closing idle
# connections, cancelling what outlived the grace, the app's lifespan shutdown), so the process
# is gone within its grace period.
SHUTDOWN_S = 1.0
WORK_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})


@dataclass
class Drain:
    """The drain state of one process; lives on its event loop's thread."""
    grace_s: float = DEFAULT_GRACE_S
    draining: bool = False
    stopping: bool = False               # what is still held is being cut short (stop())
    # The tasks serving the work requests accepted and not yet answered in full (DrainGuard).
    _held: set[asyncio.Task] = field(default_factory=set, repr=False)
    _deadline: float = field(default=0.0, repr=False)

    @property
    def in_flight(self) -> int:
        return len(self._held)

    def begin(self) -> None:
        if not self.draining:
            self.draining = True
            self._deadline = time.monotonic() + max(self.grace_s - SHUTDOWN_S, 0.0)

    def finished(self) -> bool:
        """Draining and nothing held any more, or the grace period is over."""
        return self.draining and (not self._held or time.monotonic() >= self._deadline)

    def stop(self) -> int:
        """Cut short what is still held, on the event loop's thread: each request's task is
        cancelled and its DrainGuard ends it cleanly. Before uvicorn's shutdown, which would
        cancel them itself (a traceback and a plain-text 500 each). Returns how many."""
        if not self.stopping:
            self.stopping = True
            for task in self._held:
                task.cancel()
        return len(self._held)


def refusal_body(who: str) -> dict:
    """What a draining process answers to new work (OpenAI-shaped, like every error here)."""
    return {"error": {"message": f"this {who} is draining (shutting down): it finishes the "
                                 f"requests it holds and takes no new ones; retry on another replica",
                      "type": DRAINING_TYPE, "code": 503}}


def stopped_body(who: str) -> dict:
    """What a request cut short by the stop gets. Of type `draining` too: the replica is going
    away, and a gateway retries the request elsewhere without counting a failure of the pod."""
    return {"error": {"message": f"this {who} stopped before it finished the request (told to stop "
                                 f"at once while draining, or its drain grace period ran out); "
                                 f"retry on another replica",
                      "type": DRAINING_TYPE, "code": 503}}


class DrainGuard:
    """ASGI middleware: counts the work requests in flight (until their last byte is sent) and,
    while draining, refuses new ones with 503 `draining`, Retry-After and `Connection: close`
    (so keep-alive clients reconnect, through their Service, to another replica). A request the
    stop cuts short (Drain.stop) ends here as cleanly as what it already sent allows."""

    def __init__(self, app, drain: Drain, who: str, paths: Collection[str] = WORK_PATHS) -> None:
        self.app, self.drain, self.who, self.paths = app, drain, who, frozenset(paths)
        self._refusal = json.dumps(refusal_body(who)).encode()
        self._stopped = json.dumps(stopped_body(who)).encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        if self.drain.draining:
            return await _send_503(send, self._refusal)
        task = asyncio.current_task()
        sent = _Sent(send)
        self.drain._held.add(task)
        try:
            await self.app(scope, receive, sent.send)
        except asyncio.CancelledError:
            if not self.drain.stopping:  # not ours (uvicorn's, the loop's): theirs to handle
                raise
            task.uncancel()
            with contextlib.suppress(OSError):  # the client left already: nothing to tell
                await self._cut_short(sent)
        finally:
            self.drain._held.discard(task)

    async def _cut_short(self, sent: _Sent) -> None:
        if not sent.started:
            await _send_503(sent.send, self._stopped)
        elif sent.sse and not sent.done:
            # The status line is gone: end the stream with an error event (and no [DONE]), as
            # the gateway's other mid-stream errors do (docs/http-api.md, "Streaming").
            await sent.send({"type": "http.response.body", "body": b"data: " + self._stopped + b"\n\n"})
        # A plain answer half sent: nothing clean is left to say; uvicorn closes the connection.


async def _send_503(send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"retry-after", b"1"),
        (b"connection", b"close"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class _Sent:
    """What of a response went out: whether it began, is an SSE stream, ended."""
    __slots__ = ("_send", "started", "sse", "done")

    def __init__(self, send) -> None:
        self._send, self.started, self.sse, self.done = send, False, False, False

    async def send(self, message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                           for k, v in message.get("headers", ()))
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.done = True
        await self._send(message)


class DrainingServer(uvicorn.Server):
    """uvicorn, with the first SIGTERM/SIGINT starting a drain instead of a shutdown, and a second
    one cutting the drain short (Drain.stop). The exit is uvicorn's own shutdown, started once
    the drain finished or was cut short; the signal is not re-raised afterwards: `exit_status`
    says how it ended."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        config.timeout_graceful_shutdown = SHUTDOWN_S
        super().__init__(config)
        self.drain = drain
        self.stopped_by: int | None = None   # the second signal, if one came

    @property
    def exit_status(self) -> int:
        return 0 if self.stopped_by is None else 128 + self.stopped_by

    def handle_exit(self, sig: int, frame) -> None:
        # A signal handler: it only sets flags; on_tick, on the event loop, acts on them.
        if self.should_exit or self.stopped_by is not None:
            # On its way out already (drained, or a third signal): stop waiting for anything,
            # as uvicorn's own second Ctrl-C does.
            self.should_exit = self.force_exit = True
        elif self.drain.draining:
            self.stopped_by = sig
        else:
            self.drain.begin()
            log.warning("%s: draining %d request(s) in flight, at most %.0fs (a second signal stops now)",
                        signal.Signals(sig).name, self.drain.in_flight, self.drain.grace_s)

    async def on_tick(self, counter: int) -> bool:
        # uvicorn ticks every 0.1 s: the exit follows the last request, or the signal, by that much.
        if (self.drain.finished() or self.stopped_by is not None) and not self.should_exit:
            if self.stopped_by is not None:
                log.warning("%s: stopping now, cutting %d request(s) short",
                            signal.Signals(self.stopped_by).name, self.drain.stop())
            elif self.drain.in_flight:
                log.error("drain grace period over: cancelling %d request(s)", self.drain.stop())
            else:
                log.info("drained: no request in flight, exiting")
            self.should_exit = True
        return await super().on_tick(counter)
