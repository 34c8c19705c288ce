"""Small HTTP helpers of the engine server: SSE framing, error bodies, client-disconnect races."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncGenerator, AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from laps_agent.engine.http import api_models as api
from laps_agent.modelio.tokenizer import loads_json_text, unencodable_message, unencodable_text
from laps_agent.serving.request_body import BodyRefused, read_request_body
from laps_agent.serving.request_id import shown

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client hung up before the answer was ready."""


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def error(exc: api.ApiError) -> JSONResponse:
    headers = {"retry-after": str(exc.retry_after)} if exc.retry_after is not None else {}
    if exc.status == 408:  # its body never came whole: the connection cannot carry another request
        headers["connection"] = "close"
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers or None)


def failed(request: Request, exc: api.ApiError) -> JSONResponse:
    """`error(exc)` for a work request, logged (`log_failure`)."""
    log_failure(shown(request.scope), exc)
    return error(exc)


def log_failure(request_id: str, exc: api.ApiError, *, mid_stream: bool = False) -> None:
    """A work request's failure, logged with its id (X-Request-ID, which the gateway forwards:
    laps_agent/serving/request_id.py), whether it is answered with a status (`failed`) or as the error
    event of a stream already under way (`mid_stream`). A warning for the engine's own failures
    (5xx: a KV hand-off that timed out, the engine loop failing); debug for refusals of the
    request (4xx) and of load (queue_full, which can come by the thousand while the gateway
    retries elsewhere)."""
    own = exc.status >= 500 and exc.type != "queue_full"
    log.log(logging.WARNING if own else logging.DEBUG, "request %s failed%s with %d %s: %s", request_id,
            " mid-stream" if mid_stream else "", exc.status, exc.type, exc.message)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Routing's 404 (no such path) and 405 (no such method there) in the shape of every other
    error here: FastAPI's `{"detail": ...}` reached OpenAI clients as a message-less error."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if raw else request.url.path
    path = path if len(path) <= 200 else path[:200] + "..."   # bounded: it is echoed
    headers = dict(exc.headers or ())
    if exc.status_code == 404:
        message = f"Invalid URL ({request.method} {path}): no such endpoint on this engine"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {path} (allowed: {headers.get('Allow', 'none')})"
    else:
        message = str(exc.detail)
    return JSONResponse(api.ApiError(exc.status_code, message).body(), status_code=exc.status_code,
                        headers=headers or None)


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


async def read_json(request: Request, idle_s: float) -> Any:
    """The request body, parsed: ApiError 4xx when it is not usable JSON text (unencodable_text:
    templates, stop strings and the tokenizer fail on it), ClientGone when the client hangs up
    mid-upload (its own timeout, a cancelled call: no engine bug, so no traceback)."""
    raw = await read_body(request, idle_s)
    try:
        body, text = loads_json_text(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise api.ApiError(400, f"malformed JSON body: {exc}") from None
    except RecursionError:
        raise api.ApiError(400, "malformed JSON body: nested too deeply") from None
    where = None if text else unencodable_text(raw, body)
    if where is not None:
        raise api.ApiError(400, unencodable_message(where))
    return body


async def read_body(request: Request, idle_s: float) -> bytes:
    """The whole request body (laps_agent/serving/request_body.py): ApiError 415 compressed, 408 stalled
    for `idle_s`; ClientGone when the client hung up mid-upload."""
    try:
        return await read_request_body(request, idle_s=idle_s)
    except BodyRefused as refused:
        raise api.ApiError(refused.status, str(refused)) from None
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
