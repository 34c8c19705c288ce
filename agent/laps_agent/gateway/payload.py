"""The body the gateway posts to both engines: the client's own JSON bytes with the PD fields
(`bootstrap_host`, `bootstrap_port`, `bootstrap_room`) spliced in before the closing brace.

Re-encoding the parsed body would cost time in proportion to the prompt (~0.1 ms per 40 KB, and
another parse-sized walk); splicing costs a copy. Only bytes that are a plain UTF-8 JSON object
(first byte `{`, last `}` after whitespace) are spliced; anything else json.loads accepts (a
UTF-16/32 or BOM-prefixed body) is re-encoded, as is a body that carries its own `bootstrap_*`
keys: those are dropped, so the engines see exactly one of each, the gateway's."""
from __future__ import annotations

import json

BOOTSTRAP_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
_JSON_WHITESPACE = b" \t\r\n"


class PDPayload:
    """One request's body, ready to take the PD fields of each attempt."""

    __slots__ = ("_head", "_comma")

    def __init__(self, raw: bytes, body: dict) -> None:
        """`raw` is the request body as received and `body` what json.loads made of it."""
        if any(key in body for key in BOOTSTRAP_KEYS):
            body = {k: v for k, v in body.items() if k not in BOOTSTRAP_KEYS}
            raw = json.dumps(body).encode()
        text = raw.strip(_JSON_WHITESPACE)
        if text[:1] != b"{" or text[-1:] != b"}":
            text = json.dumps(body).encode()
        # The object without its closing brace (a view: no copy until an attempt's body is
        # joined), and a comma if it has members.
        self._head = memoryview(text)[:-1]
        self._comma = b"," if body else b""

    def with_bootstrap(self, host: str, port: int | None, room: int) -> bytes:
        return b"".join((self._head, self._comma, b'"bootstrap_host":%s,"bootstrap_port":%s,"bootstrap_room":%d}' % (
            json.dumps(host).encode(), b"null" if port is None else b"%d" % port, room)))
