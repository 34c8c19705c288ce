"""The gateway's engine-load poller over a real loopback pod: it outlives a cycle that fails."""
from __future__ import annotations

import asyncio
import json

from laps_agent.gateway.discovery.membership import Discovery, Membership
from laps_agent.gateway.proxy.engine_load import EngineLoadPoller, EngineLoads
from laps_agent.policy.routing import Endpoint


async def _pod() -> tuple[asyncio.AbstractServer, str]:
    """A decode pod's /get_load: 48 slots."""
    report = json.dumps({"waiting_requests": 0, "pending_tokens": 0, "max_running_requests": 48}).encode()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(report), report))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


class _FailsOnce(Discovery):
    """A discovery whose first answer is a bug's exception."""

    def __init__(self, url: str) -> None:
        self.asked = 0
        self._membership = Membership(decode=(Endpoint("decode-0", url, "127.0.0.1", None),))

    def membership(self) -> Membership:
        self.asked += 1
        if self.asked == 1:
            raise RuntimeError("a bug in one cycle")
        return self._membership


async def test_a_cycle_that_raises_does_not_end_polling(caplog):
    """Anything a cycle raised ended the poller's task for the rest of the process: the engines'
    load, decode slots and measured admission bounds were gone, and nothing said so until exit."""
    server, url = await _pod()
    loads = EngineLoads(0.05)
    discovery = _FailsOnce(url)
    poller = EngineLoadPoller(loads, discovery, own=lambda: {})
    await poller.start()
    try:
        async with asyncio.timeout(10):
            while loads.slots("decode-0") is None:
                await asyncio.sleep(0.01)
    finally:
        await poller.stop()
        server.close()
    assert loads.slots("decode-0") == 48 and discovery.asked >= 2
    assert "engine load poll failed; polling goes on" in caplog.text
