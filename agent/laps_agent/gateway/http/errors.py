"""The gateway's own error answers, every one in OpenAI's shape.

OpenAI clients read `error.message` out of `{"error": {"message", "type", "code"}}`; FastAPI's
`{"detail": ...}` (its 404, 405 and 422) and Starlette's plain-text 500 reached the `openai`
client as a message-less error ("Error code: 404 - {'detail': 'Not Found'}"). So FastAPI's own
exception handlers are replaced here, and the work routes' fast path (app.py) answers its
crashes with the same shape; invalid fields are a 400, as OpenAI and SGLang answer them. None
of this runs on a request that succeeds."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from laps_agent.gateway.proxy.failures import error_body

log = logging.getLogger(__name__)

# What a 404 for an unknown path names, so a client with a wrong base URL sees the right one.
_ENDPOINTS = "POST /v1/chat/completions, /v1/completions, /generate; GET /v1/models"


# OpenAI's SDKs (Python, Node and the other generated ones) resend a 408, 409, 429 or any 5xx
# twice by default unless the answer carries this header (which OpenAI's own API sends).
NO_RETRY_HEADER = ("x-should-retry", "false")


def error_response(status: int, message: str, *, retry_after: int | None = None,
                   no_retry: bool = False, headers: dict[str, str] | None = None,
                   kind: str | None = None) -> JSONResponse:
    headers = dict(headers or ())
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    if no_retry:
        headers[NO_RETRY_HEADER[0]] = NO_RETRY_HEADER[1]
    if status == 408:  # its body never came whole: the connection cannot carry another request
        headers["connection"] = "close"
    return JSONResponse(error_body(status, message, kind), status_code=status, headers=headers or None)


def validation_message(errors: list[dict]) -> str:
    """One line from pydantic's (or FastAPI's) error list: where, and what is wrong there."""
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def _shown_path(request: Request) -> str:
    # The path as sent (GatewayApp strips a trailing slash from `path`), bounded: it is echoed.
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if raw else request.scope.get("path", "")
    return path if len(path) <= 200 else path[:200] + "..."


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing's 404 (no such path) and 405 (no such method there), and any HTTPException."""
    method, path = request.method, _shown_path(request)
    headers = dict(exc.headers or ())
    if exc.status_code == 404:
        # OpenAI's own wording for an unknown path starts the same way.
        message = f"Invalid URL ({method} {path}): no such endpoint here ({_ENDPOINTS})"
    elif exc.status_code == 405:
        message = (f"method {method} is not allowed on {path} (allowed: "
                   f"{headers.get('Allow', headers.get('allow', 'none'))})")
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, message, headers=headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(400, validation_message(list(exc.errors())))


def _internal(exc: Exception) -> JSONResponse:
    return error_response(500, f"internal error in the gateway ({type(exc).__name__}); "
                               "its log has the details")


async def _crash(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's error middleware sends this, then re-raises the exception for uvicorn to log.
    return _internal(exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _crash)


def crash_response(exc: Exception, request_id: str = "-") -> JSONResponse:
    """An unexpected exception on the work routes' fast path, before any response byte: logged
    here (uvicorn would have), answered as the app's error middleware answers (_crash)."""
    log.error("internal error serving request %s", request_id, exc_info=exc)
    return _internal(exc)
