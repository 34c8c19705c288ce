"""A bound on how long a client may take to send a request's headers, for every laps HTTP server:
the gateway, the engines' API and bootstrap (KV hand-off) ports, and the servers tests start.

uvicorn bounds no header read: its keep-alive timer starts only once a response is complete, and
the next byte cancels it. A connection that never sent a byte, or sent half its headers and
stopped (slowloris), was held forever, each with a file descriptor; enough of them exhausted the
process's descriptors and the server stopped accepting anyone. This is nginx's
client_header_timeout: the default lives beside the body's bound, in request_body.py."""
from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from laps_agent.serving.request_body import HEADER_TIMEOUT_S

# Where a request's scope holds `abort()`, which drops its connection at once (the transport's
# abort): for an app that gives up on a client taking no bytes (gateway/relay.py). ASGI offers
# none: a response can only wait in `send` for as long as the client does not read.
ABORT_SCOPE_KEY = "laps.abort"


def http_protocol(header_timeout_s: float = HEADER_TIMEOUT_S):
    """What uvicorn.Config's `http=` takes for a server whose clients get `header_timeout_s`
    seconds to send each request's headers (<= 0: no bound, uvicorn's own httptools protocol)."""
    if header_timeout_s <= 0:
        return "httptools"
    if header_timeout_s == HeaderTimeoutProtocol.header_timeout_s:
        return HeaderTimeoutProtocol
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,),
                {"header_timeout_s": header_timeout_s})


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for the headers, armed when the connection
    opens and when a request's first byte comes, cancelled once its headers are whole: a timer per
    connection and per request, never per byte, so the parsing fast path is uvicorn's own.

    A connection idle between requests is not timed here (its timer went with the last request's
    headers): that is uvicorn's timeout_keep_alive's."""

    header_timeout_s = HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None
    _header_begun = False  # some of a request's headers came (else: a silent connection)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[ABORT_SCOPE_KEY] = self.transport.abort
        self._header_begun = True
        if self._header_timer is None:  # a new connection's timer already runs for its first one
            self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Bytes that begin no request still cancel uvicorn's keep-alive timer: a bare CRLF
        # after an answer, or the rest of a body the app answered without reading. With no
        # answer under way and no timer armed, they too get one, or they hold the fd forever.
        if (self._header_timer is None and not self.transport.is_closing()
                and (self.cycle is None or self.cycle.response_complete)):
            self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._header_begun and self.timeout_keep_alive_task is not None:
            # A pipelined request's headers are partly in: they get their whole header time
            # and a 408, not uvicorn's keep-alive close (5 s, and no answer).
            self._unset_keepalive_if_required()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self._header_begun = False
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # The late headers are a pipelined next request's, behind one still being answered
            # (perhaps streaming for minutes): closing now would cut that answer short. Look
            # again later; once it is complete, this one is answered below.
            self._arm_header_timer()
            return
        if self._header_begun:
            # No answer is under way (checked above), so a 408 cannot interleave with another.
            self.transport.write(self._timeout_answer())
        # A connection that sent nothing has no request to answer: it is only closed.
        self.transport.close()

    def _timeout_answer(self) -> bytes:
        # OpenAI-shaped, as every other error the gateway and the engines answer.
        body = json.dumps({"error": {
            "message": f"the request's headers did not arrive within {self.header_timeout_s:g}s",
            "type": "invalid_request_error", "code": 408}}).encode()
        head = [STATUS_LINE[408]]
        for name, value in self.server_state.default_headers:  # date, server: as uvicorn's own
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n",
                 b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]
        return b"".join(head)
