"""`X-Request-ID`: one id per request, the same in the gateway's, the prefill engine's and the
decode engine's logs, and in every response (`x-request-id`, which OpenAI's SDKs read into
`response._request_id` and `APIStatusError.request_id`, as api.openai.com sends it).

The front door (the gateway; an engine called directly) takes the client's id when it is sane,
else makes one; the gateway forwards it to both engines as the same header. "Sane" is what can
go into a log line and a response header as it is: 1-128 visible ASCII characters (no space,
no control character); anything else would let a client write into the operators' logs, so it
is replaced, not escaped. The id is only a label: it is never an engine's own request id (the
builtin engine's `rid`, SGLang's body `rid`), since two clients may well send the same one.

Cost on the hot path: one scan of the header list, 16 random bytes when the client sent none,
and one header appended to the response's first message (`tagged`)."""
from __future__ import annotations

import binascii
import os
import re
from collections.abc import Awaitable, Callable

HEADER = b"x-request-id"
SCOPE_KEY = "laps.request_id"   # the id (bytes) in the ASGI scope, for the handlers' logs
MAX_LENGTH = 128
_SANE = re.compile(rb"[\x21-\x7e]{1,%d}" % MAX_LENGTH)


def new_request_id() -> bytes:
    """32 hex digits: as unique as a uuid4, cheaper to make."""
    return binascii.hexlify(os.urandom(16))


def client_request_id(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The client's `X-Request-ID` if it is sane (see the module docstring), else None. ASGI
    servers lower-case header names."""
    for name, value in headers:
        if name == HEADER:
            return value if _SANE.fullmatch(value) else None
    return None


def tagged(scope: dict, send: Callable[[dict], Awaitable[None]]) -> Callable[[dict], Awaitable[None]]:
    """Give an HTTP request its id (`scope[SCOPE_KEY]`) and return `send` adding `x-request-id`
    to the response, whoever builds it (routes, error handlers, guards ahead of them). A plain
    function handing back `send`'s awaitable, not a coroutine of its own: one call per message,
    and a stream sends one message per chunk."""
    rid = client_request_id(scope["headers"]) or new_request_id()
    scope[SCOPE_KEY] = rid
    header = (HEADER, rid)

    def send_tagged(message: dict) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), header]
        return send(message)

    return send_tagged


def shown(scope: dict) -> str:
    """The request's id for a log line ("-" outside a tagged request)."""
    rid = scope.get(SCOPE_KEY)
    return rid.decode("ascii") if rid is not None else "-"
