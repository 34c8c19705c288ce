"""Client hang-ups and the streamed answer, on the request's own task; the prefill calls left to
finish after their answer.

A client that goes away must cancel both upstream calls at once. Watching for that costs one
small task per request: it waits for `http.disconnect` and cancels the request's task, but only
while armed, so it can never cancel the task after the guarded block ended (everything between
disarming and the next await runs without yielding to it)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.responses import Response

from laps_agent.gateway.proxy.replies import StreamReply
from laps_agent.serving.header_timeout import ABORT_SCOPE_KEY

log = logging.getLogger(__name__)

_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]


class HangupGuard:
    """`async with HangupGuard(receive) as guard:` — the block is cancelled if the client
    disconnects meanwhile; afterwards `guard.gone` says whether it did."""

    def __init__(self, receive) -> None:
        self._receive = receive
        self.gone = False
        self._armed = False

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self._armed:
            self._task.cancel()

    async def __aenter__(self) -> HangupGuard:
        self._task = asyncio.current_task()
        self._armed = True
        self._watcher = asyncio.ensure_future(self._watch())
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        self._armed = False
        # Let go of the watcher as it is cancelled: the task keeps its CancelledError, whose
        # traceback holds the watcher's frame, so this guard; held from here too, the whole
        # set (~20 objects a request) would wait for the cyclic GC instead of going at once.
        watcher, self._watcher = self._watcher, None
        watcher.cancel()
        if exc_type is asyncio.CancelledError and self.gone:
            self._task.uncancel()
            return True  # our own cancellation: the caller reads `gone`
        return False


class RelayResponse(Response):
    """An ASGI response streaming the decode pod's answer: each upstream chunk is sent as it
    arrives (uvicorn writes it at once; TCP_NODELAY is on), the upstream call is released at
    the end and cancelled if the client leaves. Unlike Starlette's StreamingResponse it needs
    no task group: the relay runs on the request's task.

    A client that keeps its connection but stops reading is dropped: once its socket and
    uvicorn's buffer are full, `send` waits for it with no bound, and the request held its
    decode pod's slot and its class's decode share (so that class got 429s sooner) and its
    deadline never came. A watchdog aborts the connection when one send has waited
    `stall_s` (GatewayConfig.client_stall_s) or is still waiting at the request's deadline
    (`until`, the loop's clock; the deadline's SSE error event cannot reach a client that does
    not read): a timer per stream, not per chunk. Counted as laps_gateway_errors_total
    {reason="client_stalled"}."""

    def __init__(self, reply: StreamReply, *, stall_s: float | None = None, until: float | None = None,
                 stalled: Callable[[], None] | None = None) -> None:
        """`stalled` is called once if the watchdog drops the client (a metric)."""
        self._reply = reply
        self.stall_s, self.until, self.stalled = stall_s, until, stalled
        self.status_code = 200
        self.background = None
        self.raw_headers = list(_SSE_HEADERS)
        self.sending_since: float | None = None   # loop time the send under way began

    @property
    def reply(self) -> StreamReply:
        return self._reply

    async def __call__(self, scope, receive, send) -> None:
        abort = scope.get(ABORT_SCOPE_KEY)
        watchdog = None if abort is None or (self.stall_s is None and self.until is None) else _Watchdog(self, abort)
        loop = asyncio.get_running_loop()

        async def sent(message: dict) -> None:
            self.sending_since = loop.time()
            await send(message)
            self.sending_since = None

        try:
            await sent({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with HangupGuard(receive):   # the watchdog's abort ends up here as a hang-up
                async for chunk in self._reply.chunks:
                    await sent({"type": "http.response.body", "body": chunk, "more_body": True})
                await sent({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if watchdog is not None:
                watchdog.cancel()
            await self._reply.chunks.aclose()  # stopped at a `yield` if `send` was cancelled
            await self._reply.close()


class _Watchdog:
    """Aborts a relay's connection once its current send has waited `stall_s`, or is still
    waiting at `until`. Checks every few seconds (half the stall bound, at most 5 s), and at
    `until`."""

    def __init__(self, relay: RelayResponse, abort) -> None:
        self._relay, self._abort = relay, abort
        self._loop = asyncio.get_running_loop()
        self._every = max(0.05, min(relay.stall_s or 10.0, 10.0) / 2)
        self._handle = self._loop.call_later(self._delay(self._loop.time()), self._check)

    def _delay(self, now: float) -> float:
        until = self._relay.until
        return self._every if until is None or until <= now else max(0.05, min(self._every, until - now))

    def _check(self) -> None:
        relay, now = self._relay, self._loop.time()
        since = relay.sending_since
        late = relay.until is not None and now >= relay.until
        if since is not None and (late or (relay.stall_s is not None and now - since >= relay.stall_s)):
            log.warning("the client took no bytes of its stream for %.0fs%s: connection dropped",
                        now - since, ", past the request's deadline" if late else "")
            if relay.stalled is not None:
                relay.stalled()
            self._abort()
            return
        self._handle = self._loop.call_later(self._delay(now), self._check)

    def cancel(self) -> None:
        self._handle.cancel()


class Leftovers:
    """Prefill calls left to finish after their request's answer: by then a prefill call is all
    but done, and cancelling it would only close a keep-alive connection (and tell the engine to
    abort work it has finished). Those still running at shutdown are cancelled."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def let_finish(self, task: asyncio.Task) -> None:
        if task.done():
            self._forget(task)
            return
        self._tasks.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # already counted where it failed; retrieved so asyncio stays quiet

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
