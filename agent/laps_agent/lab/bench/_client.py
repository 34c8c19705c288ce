"""A minimal asyncio HTTP/1.1 client for streaming load: keep-alive pool, chunked bodies, SSE.

The load generator shares two cores with the servers it measures and must handle hundreds of
requests and thousands of SSE events per second, so it is an `asyncio.Protocol` that parses
in `data_received` (no coroutine switch per chunk or event, one timestamp per read) rather than
a general client (httpx costs about as much CPU per request as the gateway itself).

`StreamClient.stream(path, body)` POSTs JSON and returns a `StreamOutcome`: status, error (HTTP
error message, SSE `{"error": ...}` event, cut stream, timeout, connection error), the arrival
times of every event carrying non-empty content (`text`, `delta.content` or
`delta.reasoning_content`) and usage.prompt_tokens. Every exchange is bounded by `timeout`.
"""
from __future__ import annotations

import asyncio
import json
import ssl
import time
from urllib.parse import urlsplit

from laps_agent.lab.bench._http_stream import StreamOutcome, _Conn, _Retry  # noqa: F401 (StreamOutcome: API)


class StreamClient:
    """Keep-alive connections to one base URL (http or https)."""

    def __init__(self, base_url: str, *, connect_timeout: float = 10.0, api_key: str | None = None):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        prefix = parts.path.rstrip("/")
        self.prefix = prefix[:-3] if prefix.endswith("/v1") else prefix   # accept ".../v1" too
        self.connect_timeout = connect_timeout
        self._host_header = (f"{self.host}:{self.port}" if parts.port else self.host).encode()
        # Sent with every request (a gateway with API keys); kept out of repr and logs.
        self._auth = b"authorization: Bearer %s\r\n" % api_key.encode() if api_key else b""
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()

    def _release(self, conn: _Conn) -> None:
        self._idle.append(conn)

    async def _connection(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and not conn.transport.is_closing():
                conn.reused = True
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Conn(self), self.host, self.port, ssl=self.ssl),
            self.connect_timeout)
        self._all.add(conn)
        return conn

    def _request(self, method: str, path: str, body: bytes | None) -> bytes:
        head = b"%s %s HTTP/1.1\r\nhost: %s\r\naccept: */*\r\n%s" % (
            method.encode(), (self.prefix + path).encode(), self._host_header, self._auth)
        if body is None:
            return head + b"\r\n"
        return head + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    async def exchange(self, method: str, path: str, body: bytes | None, timeout: float,
                       expect_stream: bool = True, outcome: StreamOutcome | None = None) -> StreamOutcome:
        """`outcome` (optional) is filled in as the answer arrives, so a caller that cancels
        the exchange still has what was received."""
        request = self._request(method, path, body)
        deadline = time.perf_counter() + timeout
        outcome = outcome if outcome is not None else StreamOutcome()
        for _ in range(2):
            outcome.sent_at = time.perf_counter()
            try:
                conn = await self._connection()
            except asyncio.TimeoutError:
                outcome.error, outcome.end_at = f"cannot connect to {self.host}:{self.port}: timed out", time.perf_counter()
                return outcome
            except OSError as exc:
                outcome.error = f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}"
                outcome.end_at = time.perf_counter()
                return outcome
            waiter = asyncio.get_running_loop().create_future()
            conn.start(request, outcome, waiter, expect_stream)
            timer = asyncio.get_running_loop().call_at(
                asyncio.get_running_loop().time() + max(0.0, deadline - time.perf_counter()),
                conn.abort, f"timed out after {timeout:g}s")
            try:
                return await waiter
            except _Retry:
                continue
            except asyncio.CancelledError:
                conn.abort("cancelled")
                raise
            finally:
                timer.cancel()
        outcome.error, outcome.end_at = "connection closed by the server before answering", time.perf_counter()
        return outcome

    async def stream(self, path: str, payload: dict, timeout: float,
                     outcome: StreamOutcome | None = None) -> StreamOutcome:
        return await self.exchange("POST", path, json.dumps(payload).encode(), timeout, True, outcome)

    async def get(self, path: str, timeout: float) -> StreamOutcome:
        """A GET: `status` (0 when nothing answered), `body`, `error`."""
        return await self.exchange("GET", path, None, timeout, expect_stream=False)

    def close(self) -> None:
        for conn in list(self._all):
            if not conn.closed:
                conn.transport.close()
        self._idle.clear()
        self._all.clear()
