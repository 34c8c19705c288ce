"""Client hang-ups and the streamed answer, on the request's own task; the prefill calls left to
finish after their answer.

A client that goes away must cancel both upstream calls at once. Watching for that costs one
small task per request: it waits for `http.disconnect` and cancels the request's task, but only
while armed, so it can never cancel the task after the guarded block ended (everything between
disarming and the next await runs without yielding to it)."""
from __future__ import annotations

import asyncio

from starlette.responses import Response

from laps_agent.gateway.replies import StreamReply

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
    no task group: the relay runs on the request's task."""

    def __init__(self, reply: StreamReply) -> None:
        self._reply = reply
        self.status_code = 200
        self.background = None
        self.raw_headers = list(_SSE_HEADERS)

    @property
    def reply(self) -> StreamReply:
        return self._reply

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with HangupGuard(receive):
                async for chunk in self._reply.chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self._reply.chunks.aclose()  # stopped at a `yield` if `send` was cancelled
            await self._reply.close()


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
