"""Small HTTP helpers of the engine server: SSE framing, error bodies, client-disconnect races."""
from __future__ import annotations

import asyncio
import json
from typing import AsyncGenerator, AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from laps_agent.engine import api_models as api


class ClientGone(Exception):
    """The client hung up before the answer was ready."""


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def error(exc: api.ApiError) -> JSONResponse:
    headers = {"retry-after": str(exc.retry_after)} if exc.retry_after is not None else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def until_disconnect(request: Request, awaitable):
    """Run `awaitable`, cancelling it (and raising ClientGone) if the client hangs up first."""
    task = asyncio.ensure_future(awaitable)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        try:
            await task
        except BaseException:  # noqa: BLE001 - we only wanted it gone
            pass
        raise ClientGone()
    return task.result()


async def read_body(request: Request) -> bytes:
    """The whole request body; ClientGone when the client hangs up mid-upload (its own timeout,
    a cancelled call: no engine bug, so no traceback)."""
    try:
        return await request.body()
    except ClientDisconnect:
        raise ClientGone() from None


async def until_stream_end(events: AsyncGenerator[bytes, None], on_cut: Callable[[], object]) -> AsyncIterator[bytes]:
    """`events` as they come, calling `on_cut` if the stream is closed before its end (the
    client left: the server cancels or closes the response's iterator). `events` is closed
    here at once, not whenever it is collected: closing it aborts the engine's request."""
    ended = False
    try:
        async for chunk in events:
            yield chunk
        ended = True
    finally:
        if not ended:
            on_cut()
        await events.aclose()
