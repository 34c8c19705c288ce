"""A minimal keep-alive HTTP/1.1 client for load generation.

The benchmark client shares the CPU with what it measures, so it must cost far less per request
than the gateway; a general-purpose client (httpx) costs about as much as the gateway itself."""
from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import urlsplit


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer


class LoadClient:
    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    async def _connect(self, host: str, port: int) -> _Conn:
        pool = self._idle.get((host, port))
        while pool:
            conn = pool.pop()
            if not conn.reader.at_eof():  # the server may have closed it while idle
                return conn
            conn.writer.close()
        reader, writer = await asyncio.open_connection(host, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Conn(reader, writer)

    async def post(self, url: str, body: dict | bytes) -> tuple[int, float]:
        """POST JSON (a dict, or its encoding: large bodies are encoded once by the caller, so
        the load generator's own cost does not grow with them); returns (status, seconds until
        the first body byte) after reading it all."""
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            return await self._post(url, payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            # An idle keep-alive connection closed by the server just as it was reused.
            return await self._post(url, payload)

    async def _post(self, url: str, payload: bytes) -> tuple[int, float]:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        conn = await self._connect(host, port)
        start = time.perf_counter()
        conn.writer.write(b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (parts.path.encode(), host.encode(),
                                                              port, len(payload), payload))
        head = await conn.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        headers = head.lower()
        if b"transfer-encoding: chunked" in headers:
            first = None
            while True:
                size = int((await conn.reader.readuntil(b"\r\n"))[:-2], 16)
                await conn.reader.readexactly(size + 2)
                if first is None:
                    first = time.perf_counter() - start
                if size == 0:
                    break
        else:
            length = int(headers.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            await conn.reader.readexactly(length)
            first = time.perf_counter() - start
        self._idle.setdefault((host, port), []).append(conn)
        return status, first

    async def aclose(self) -> None:
        for pool in self._idle.values():
            for conn in pool:
                conn.writer.close()
        self._idle.clear()
