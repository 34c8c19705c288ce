"""The decode side's GET of a KV answer, read straight from the socket into its final buffer.

A prompt's KV is tens of MB. Through httpx it came in 64 KB pieces, each parsed by h11 and then
copied into the receive buffer: ~3x the time a plain socket needs for the same bytes. Here an
asyncio BufferedProtocol lets the event loop `recv_into` a small scratch buffer until httptools
has parsed the response head, and then into slices of one fresh buffer sized by Content-Length,
placed so the frame's body starts BODY_ALIGN-aligned (the codec views the tensor in place).

Only the big body skips the parser. Anything else (non-200 answers, small or chunked bodies, a
body delimited by the connection's end) goes through httptools whole and comes back as bytes.
Failures are raised as httpx's exceptions, with its wording, so `fetch_payload` treats them
exactly as it treats the httpx path's (retry until the deadline). One connection per request:
a long poll holds it for seconds anyway, and connecting on loopback or a LAN costs far less than
the per-request overhead of the httpx pool this replaces."""
from __future__ import annotations

import asyncio
import struct

import httptools
import httpx

from laps_agent.engine.pd.frame import BODY_ALIGN, DIRECT_READ_BYTES, BootstrapError, body_buffer
from laps_agent.serving.listen import url_host

# Where the response head (and the few body bytes read with it) lands before the body's buffer
# exists; httpcore reads this much at a time too.
SCRATCH_BYTES = 64 * 1024
# At most this much of the body per read: bounds the time one turn of the engine's event loop
# spends copying (the kernel hands over what is queued, up to the slice given).
READ_BYTES = 1 << 20


class Answer:
    """What `get` returns: the status, the headers (names lower-cased) and the whole body; a big
    200's body is a writable memoryview (see the module doc), anything else bytes."""

    __slots__ = ("status_code", "headers", "body")

    def __init__(self, status_code: int, headers: dict[str, str], body: bytes | memoryview) -> None:
        self.status_code, self.headers, self.body = status_code, headers, body

    @property
    def text(self) -> str:  # the bootstrap port's refusals are short UTF-8 text
        return bytes(self.body).decode("utf-8", "replace")


class _Reader(asyncio.BufferedProtocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._scratch = memoryview(bytearray(SCRATCH_BYTES))
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self._chunks: list[bytes] = []     # body pieces of an answer read through the parser
        self._length = -1                  # Content-Length of a big 200, read directly; else -1
        self._lead = bytearray()           # its first bytes, parsed with the head
        self._body: memoryview | None = None
        self._pos = 0
        self.last = loop.time()            # when bytes last came: the read timeout is idle time
        self.done: asyncio.Future[Answer] = loop.create_future()

    # ---- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None and not self.done.done():
            # The next piece of the body, straight from the socket.
            return self._body[self._pos:self._pos + READ_BYTES]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.last = self._loop.time()
        if self.done.done():  # anything after the answer is out of step: ignored, then closed
            return
        if self._body is not None:
            self._pos += nbytes
            if self._pos == self._length:
                self._finish(self._body)
            return
        try:
            self._parser.feed_data(self._scratch[:nbytes])
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"bad HTTP response: {exc}"))
            return
        if self._length >= 0 and self._body is None and len(self._lead) >= 4 and not self.done.done():
            self._place()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if exc is not None:
            self._fail(httpx.ReadError(str(exc) or type(exc).__name__))
        elif not self.head_done:
            self._fail(httpx.RemoteProtocolError("Server disconnected without sending a response."))
        elif self._length >= 0:
            self._fail(httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body "
                f"(received {self._pos + len(self._lead)} bytes, expected {self._length})"))
        elif "content-length" in self.headers or "transfer-encoding" in self.headers:
            self._fail(httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body"))
        else:  # a body delimited by the end of the connection ends here legitimately
            self._finish(b"".join(self._chunks))

    # ---- httptools --------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status, self.head_done = self._parser.get_status_code(), True
        size = self.headers.get("content-length", "")
        if self.status != 200 or "transfer-encoding" in self.headers or not size.isdigit() \
                or int(size) < DIRECT_READ_BYTES:
            return
        if self.headers.get("content-encoding", "identity") != "identity":
            # Not asked for (the request has no accept-encoding), so not decoded here either.
            self._fail(BootstrapError(
                f"KV payload sent with content-encoding {self.headers['content-encoding']!r}"))
            return
        self._length = int(size)

    def on_body(self, body: bytes) -> None:
        if self._length >= 0:
            self._lead += body
        else:
            self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self.done.done():
            return
        if self._length >= 0:  # only if the whole body came with the head: not in practice
            self._place()
        else:
            self._finish(b"".join(self._chunks))

    # ---- the body's buffer --------------------------------------------------------------------
    def _place(self) -> None:
        """The first 4 body bytes give the frame header's length, hence where the frame's body
        starts: the buffer is offset so that it is BODY_ALIGN-aligned."""
        n, lead = self._length, self._lead
        pad = -(4 + struct.unpack(">I", lead[:4])[0]) % BODY_ALIGN
        if len(lead) > n:  # httptools enforces Content-Length; this keeps the slice honest
            self._fail(BootstrapError(f"KV payload longer than its Content-Length ({n} bytes)"))
            return
        self._body = body_buffer(pad, n)
        self._body[:len(lead)] = lead
        self._pos, self._lead = len(lead), bytearray()
        if self._pos == n:
            self._finish(self._body)

    def _finish(self, body: bytes | memoryview) -> None:
        self.done.set_result(Answer(self.status, self.headers, body))

    def _fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


async def get(host: str, port: int, target: str, timeout_s: float) -> Answer:
    """GET `target` (path and query) from host:port. `timeout_s` bounds the connect and each
    wait for bytes (like httpx's connect/read timeouts), not the whole answer."""
    return await request("GET", host, port, target, timeout_s)


async def request(method: str, host: str, port: int, target: str, timeout_s: float, *,
                  body: bytes = b"", content_type: str | None = None) -> Answer:
    """`get`'s exchange with any method and a small request body (a prefix warm's POST)."""
    loop = asyncio.get_running_loop()
    reader = _Reader(loop)
    try:
        async with asyncio.timeout(timeout_s):
            await loop.create_connection(lambda: reader, host.strip("[]"), port)
    except TimeoutError:
        raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from None
    except OSError as exc:
        raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
    try:
        head = (f"{method} {target} HTTP/1.1\r\nhost: {url_host(host)}:{port}\r\naccept: */*\r\n"
                + (f"content-type: {content_type}\r\n" if content_type else "")
                + (f"content-length: {len(body)}\r\n" if body or method != "GET" else "")
                + "connection: close\r\n\r\n")
        reader.transport.write(head.encode() + body)
        while not reader.done.done():
            left = reader.last + timeout_s - loop.time()
            if left <= 0:
                raise httpx.ReadTimeout(f"no data from {host}:{port} for {timeout_s:g}s")
            await asyncio.wait([reader.done], timeout=left)
        return reader.done.result()
    finally:
        reader.transport.close()
        if not reader.done.done():  # cancelled or timed out: nobody will look at it
            reader.done.cancel()
        # The parser refers back to the reader: without this the cycle (and a body buffer of
        # tens of MB held by the reader) would wait for the cyclic GC, and memory grew fetch by
        # fetch in the benchmark, slowing each a little more.
        reader._parser = reader._body = None
