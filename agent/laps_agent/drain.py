"""Graceful drain of one serving process (an engine or the gateway).

On the first SIGTERM or SIGINT the process turns unready at once (its /health answers 503),
answers new work with 503 + error type `draining`, finishes what it holds (streams included)
and exits when it holds nothing more, or when its grace period runs out (what is still running
then is cancelled). A second signal exits at once.

Why the listener stays open while draining, rather than closing at once: between SIGTERM and
the moment every Service and gateway stopped routing to the pod, requests still arrive. A fast
503 that says `draining` is retried elsewhere by the gateway without counting as a pod failure
(gateway/failures.py), and tells any other client what happened; a refused connection would
look like a dead pod. On Kubernetes a preStop delay (operator builders) makes that window
small: the pod keeps serving normally until the endpoints controllers took it out."""
from __future__ import annotations

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
    in_flight: int = 0                   # work requests accepted and not yet answered in full
    _deadline: float = field(default=0.0, repr=False)

    def begin(self) -> None:
        if not self.draining:
            self.draining = True
            self._deadline = time.monotonic() + max(self.grace_s - SHUTDOWN_S, 0.0)

    def finished(self) -> bool:
        """Draining and nothing held any more, or the grace period is over."""
        return self.draining and (self.in_flight == 0 or time.monotonic() >= self._deadline)


def refusal_body(who: str) -> dict:
    """What a draining process answers to new work (OpenAI-shaped, like every error here)."""
    return {"error": {"message": f"this {who} is draining (shutting down): it finishes the "
                                 f"requests it holds and takes no new ones; retry on another replica",
                      "type": DRAINING_TYPE, "code": 503}}


class DrainGuard:
    """ASGI middleware: counts the work requests in flight (until their last byte is sent) and,
    while draining, refuses new ones with 503 `draining`, Retry-After and `Connection: close`
    (so keep-alive clients reconnect, through their Service, to another replica)."""

    def __init__(self, app, drain: Drain, who: str, paths: Collection[str] = WORK_PATHS) -> None:
        self.app, self.drain, self.who, self.paths = app, drain, who, frozenset(paths)
        self._refusal = json.dumps(refusal_body(who)).encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        if self.drain.draining:
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"retry-after", b"1"),
                (b"connection", b"close"), (b"content-length", str(len(self._refusal)).encode())]})
            await send({"type": "http.response.body", "body": self._refusal})
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn, with the first SIGTERM/SIGINT starting a drain instead of a shutdown. The exit is
    uvicorn's own shutdown, started once the drain finished; the signal is not re-raised
    afterwards, so a drained process exits with status 0."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        config.timeout_graceful_shutdown = SHUTDOWN_S
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame) -> None:
        if self.drain.draining:  # a second signal: stop now
            self.should_exit = self.force_exit = True
            return
        self.drain.begin()
        log.warning("%s: draining %d request(s) in flight, at most %.0fs (a second signal stops now)",
                    signal.Signals(sig).name, self.drain.in_flight, self.drain.grace_s)

    async def on_tick(self, counter: int) -> bool:
        # uvicorn ticks every 0.1 s: the exit follows the last request by that much at most.
        if self.drain.finished() and not self.should_exit:
            if self.drain.in_flight:
                log.error("drain grace period over: cancelling %d request(s)", self.drain.in_flight)
            else:
                log.info("drained: no request in flight, exiting")
            self.should_exit = True
        return await super().on_tick(counter)
