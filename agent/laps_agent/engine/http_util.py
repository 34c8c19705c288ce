"""Small HTTP helpers of the engine server: SSE framing, error bodies, client-disconnect races."""
from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import JSONResponse

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
