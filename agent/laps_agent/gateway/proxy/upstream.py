"""A small keep-alive HTTP/1.1 client for gateway -> engine calls.

The gateway makes two upstream calls per request, so their cost is most of its own: httpx
measured ~0.65 ms of CPU per call here, this ~0.05 ms (httptools' C parser does the framing:
content-length, chunked, read-to-close). One connection carries one request at a time; it goes
back to the pool only after its response was read to the end, so a half-read stream can never
leak into the next request. TCP_NODELAY is set so small writes leave at once."""
from __future__ import annotations

import asyncio
import collections
import functools
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools


@functools.lru_cache(maxsize=4096)
def address(url: str) -> tuple[str, int]:
    """(host, port) of a pod's base URL (cached: it is needed for every upstream call)."""
    parts = urlsplit(url)
    return parts.hostname, parts.port or 80


class UpstreamError(Exception):
    """Base: the call failed below HTTP (no usable response)."""


class UpstreamConnectError(UpstreamError):
    """Connecting failed, or the connection died before any response byte: safe to retry."""


class UpstreamBroken(UpstreamError):
    """The connection died (or the parser choked) after the response had begun."""


class UpstreamTimeout(UpstreamError):
    pass


class _Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.response: UpstreamResponse | None = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:
            self.close()  # bytes nobody asked for: this connection is out of step
            return
        try:
            response._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response._fail(UpstreamBroken(f"bad HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.response is not None and not self.response.complete:
            self.response._connection_lost()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """Status and headers are known when `UpstreamPool.post` returns; the body follows."""

    def __init__(self, conn: _Connection, pool: UpstreamPool, key: tuple[str, int],
                 read_timeout: float) -> None:
        self._conn, self._pool, self._key, self._read_timeout = conn, pool, key, read_timeout
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.complete = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._error: UpstreamError | None = None
        self._headers_done = False
        self._keep_alive = False
        self._wakeup: asyncio.Future | None = None
        self._released = False

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()  # only valid until the body ends
        self._headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    def _connection_lost(self) -> None:
        if not self._headers_done:
            self._fail(UpstreamConnectError("connection closed before a response"))
        elif not self.complete:
            if b"content-length" in self.headers or b"transfer-encoding" in self.headers:
                self._fail(UpstreamBroken("connection closed in the middle of the response"))
            else:  # a body delimited by the end of the connection ends here legitimately
                self.complete = True
                self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def _wait(self) -> None:
        # A bare timer handle, not asyncio.timeout: that one costs several calls per wait, and
        # a request waits 3-4 times.
        loop = self._conn._loop
        self._wakeup = waiter = loop.create_future()
        timer = loop.call_later(self._read_timeout, self._time_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._wakeup = None

    def _time_out(self, waiter: asyncio.Future) -> None:
        if not waiter.done():
            waiter.set_exception(UpstreamTimeout(f"no data for {self._read_timeout}s"))

    async def _headers(self) -> None:
        while not self._headers_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body pieces as they arrive. Ends the response (connection reused) at the end."""
        try:
            while True:
                while self._chunks:
                    yield self._chunks.popleft()
                if self.complete:
                    return
                if self._error is not None:
                    raise self._error
                await self._wait()
        finally:
            self.release()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def release(self) -> None:
        """Give the connection back if the response was read to its end, else close it."""
        if self._released:
            return
        self._released = True
        # The parser and this response refer to each other (it calls back the on_* methods):
        # dropped here, both go at once with their last reference instead of waiting for the
        # cyclic GC (~20 objects per call). No byte reaches them after this: the connection
        # no longer points here.
        self._parser = None
        conn = self._conn
        conn.response = None
        reusable = self.complete and self._keep_alive and not conn.closed
        if reusable:
            self._pool._put(self._key, conn)
        else:
            conn.close()


class UpstreamPool:
    def __init__(self, *, connect_timeout: float, read_timeout: float, max_idle_per_host: int = 256):
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._max_idle = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._kept: set[tuple[str, int]] | None = None   # keep_only's addresses; None: all

    def keep_only(self, addresses: set[tuple[str, int]]) -> None:
        """Close the idle connections to any other address, and keep none to them from now on
        (until the next call): pods that left. On Kubernetes a restarted pod comes back at a
        new IP, and each address that went kept its idle connections for the life of the
        process: sockets (to a vanished host, never closed) and memory growing with pod churn."""
        self._kept = set(addresses)
        for key in [k for k in self._idle if k not in self._kept]:
            for conn in self._idle.pop(key):
                conn.close()

    def _put(self, key: tuple[str, int], conn: _Connection) -> None:
        if self._kept is not None and key not in self._kept:
            conn.close()   # a call to a pod that left meanwhile
            return
        idle = self._idle.setdefault(key, [])
        if len(idle) < self._max_idle:
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(loop), *key)
        except TimeoutError:
            raise UpstreamConnectError(f"connect to {key[0]}:{key[1]} timed out") from None
        except OSError as exc:
            raise UpstreamConnectError(f"connect to {key[0]}:{key[1]} failed: {exc}") from None
        return conn

    async def post(self, host: str, port: int, path: str, body: bytes | tuple[bytes | memoryview, ...],
                   headers: bytes = b"") -> UpstreamResponse:
        """`body`: bytes, or pieces sent one after the other. `headers`: extra header lines,
        each ending in CRLF."""
        pieces = body if isinstance(body, tuple) else (body,)
        head = (b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n%s"
                b"content-length: %d\r\n\r\n" % (path.encode(), host.encode(), port, headers,
                                                  sum(map(len, pieces))))
        # Head and body go out in one write (writev): a long body is not copied to join them.
        return await self._request((host, port), (head, *pieces))

    async def get(self, host: str, port: int, path: str) -> UpstreamResponse:
        return await self._request((host, port), (b"GET %s HTTP/1.1\r\nhost: %s:%d\r\n\r\n" % (
            path.encode(), host.encode(), port),))

    async def _request(self, key: tuple[str, int], request: tuple[bytes | memoryview, ...]) -> UpstreamResponse:
        idle = self._idle.get(key)
        while idle:  # an idle connection the engine closed meanwhile fails before any byte
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                return await self._send(conn, key, request)
            except UpstreamConnectError:
                continue
        return await self._send(await self._connect(key), key, request)

    async def _send(self, conn: _Connection, key: tuple[str, int],
                    request: tuple[bytes | memoryview, ...]) -> UpstreamResponse:
        response = UpstreamResponse(conn, self, key, self._read_timeout)
        conn.response = response
        try:
            conn.transport.writelines(request)
            await response._headers()
        except BaseException:
            response._released = True
            response._parser = None
            conn.response = None
            conn.close()
            raise
        return response

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
