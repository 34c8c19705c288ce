"""Reading a client's request body, for the gateway and the engines alike: its encoding, its
size limit and a client that stops sending it are each refused the same way on both (a clear 4xx,
never a 500 or a hang). Each server turns a refusal into its own error reply. The headers' bound
(HEADER_TIMEOUT_S) is kept here too, beside the body's: one place for how long a client may
stall."""
from __future__ import annotations

import asyncio

from starlette.requests import Request

# The longest a request body may stop arriving (nothing new for this long) before the gateway or
# an engine answers 408 and closes the connection. uvicorn bounds no body read: a client whose
# body fell short of its Content-Length (a broken proxy, a client bug) held its connection and
# request forever on an engine, and until the request deadline on the gateway, which then
# blamed itself with a 504. nginx's client_body_timeout has the same default.
BODY_IDLE_TIMEOUT_S = 60.0
# The longest a connection may take, from its opening or from a request's first byte, to send
# that request's headers whole, on every laps HTTP server (laps_agent/serving/header_timeout.py): a
# connection that never sends a byte is closed, one stalled mid-headers answered 408 and closed.
# uvicorn bounds no header read: each such connection held a file descriptor forever, and enough
# of them stopped the server accepting anyone. nginx's client_header_timeout has the same default.
HEADER_TIMEOUT_S = 60.0


class BodyRefused(Exception):
    """The body cannot be taken: `status` (408, 413, 415), `reason` (the gateway's error
    reason label), the message as str()."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


async def read_request_body(request: Request, *, idle_s: float, limit: int | None = None) -> bytes:
    """The whole body. BodyRefused: 415 for a compressed one (else it fails later as "not valid
    UTF-8", cryptically), 413 over `limit` bytes, 408 when nothing new arrived for `idle_s`
    seconds (<= 0: no bound). starlette's ClientDisconnect passes through: a client that hung up
    mid-upload is each server's own kind of non-error."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise BodyRefused(415, "unsupported_encoding", f"Content-Encoding {encoding!r} is not "
                          "supported: send the JSON body uncompressed")
    declared = request.headers.get("content-length")
    too_large = BodyRefused(413, "body_too_large", f"request body over the {limit}-byte limit")
    if limit is not None and declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    loop = asyncio.get_running_loop()
    bounded = idle_s > 0
    try:
        # One timer per body, moved on as bytes arrive: a slow upload that keeps moving is fine.
        async with asyncio.timeout(idle_s if bounded else None) as idle:
            async for chunk in request.stream():  # its last chunk is b""
                if chunk:
                    chunks.append(chunk)
                    if bounded:
                        idle.reschedule(loop.time() + idle_s)
                size += len(chunk)
                if limit is not None and size > limit:
                    raise too_large
    except TimeoutError:
        if not idle.expired():
            raise  # not ours
        of = f" of the {declared} announced" if declared is not None else ""
        raise BodyRefused(408, "body_timeout", f"the request body stopped arriving: {size} bytes"
                          f"{of} came, then nothing for {idle_s:g}s") from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one piece (usual): no copy
