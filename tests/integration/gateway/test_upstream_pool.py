"""The gateway's upstream connection pool over real loopback servers: what it keeps idle."""
from __future__ import annotations

import asyncio

from laps_agent.gateway.proxy.upstream import UpstreamPool


class _Server:
    """An HTTP/1.1 server answering every request with a keep-alive 200; each connection it
    accepted has an Event set once the client closed it."""

    def __init__(self) -> None:
        self.connections: list[asyncio.Event] = []

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return "127.0.0.1", self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closed = asyncio.Event()
        self.connections.append(closed)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        except (asyncio.IncompleteReadError, ConnectionError):
            closed.set()
        finally:
            writer.close()

    def close(self) -> None:
        self._server.close()


async def test_idle_connections_to_pods_that_left_are_closed_and_not_kept():
    """On Kubernetes a restarted pod comes back at a new IP: each address that went kept its idle
    connections (up to 256 per pod) for the life of the gateway, with their sockets."""
    gone, stays = _Server(), _Server()
    keys = [await gone.start(), await stays.start()]
    pool = UpstreamPool(connect_timeout=5, read_timeout=5)
    try:
        for key in keys:
            responses = await asyncio.gather(*(pool.get(*key, "/x") for _ in range(3)))
            assert [await r.read() for r in responses] == [b"ok"] * 3   # read whole: kept idle
        assert (len(gone.connections), len(stays.connections)) == (3, 3)

        pool.keep_only({keys[1]})   # the first pod left
        await asyncio.wait_for(asyncio.gather(*(c.wait() for c in gone.connections)), 5)
        assert not any(c.is_set() for c in stays.connections)
        # The one that stayed is served from its idle connections: none is opened.
        assert await (await pool.get(*keys[1], "/x")).read() == b"ok"
        assert len(stays.connections) == 3
        # A call to the departed address still works, but its connection is not kept after it.
        assert await (await pool.get(*keys[0], "/x")).read() == b"ok"
        await asyncio.wait_for(gone.connections[-1].wait(), 5)
    finally:
        await pool.aclose()
        gone.close()
        stays.close()
