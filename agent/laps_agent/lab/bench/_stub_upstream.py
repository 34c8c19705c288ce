"""Compute-free upstreams for the scale-out phase of `laps bench gateway`.

Two gateway processes can only show twice one's rate if one gateway is what limits the rate. With
emulated engines (their real HTTP, tokenizer and PD protocol) the engines and the load generator
take most of a small machine, and the gateway's rate is theirs. These upstreams answer a POST
with a canned completion and `GET /get_load` with an idle report, parsing no more of a request
than its head (a raw asyncio protocol: ~0.02 ms a request), so what one gateway sustains is the
gateway's own limit. Not an engine: no KV moves, every request gets the same answer.

`python -m laps_agent.lab.bench._stub_upstream` listens on two kernel-chosen loopback ports (prefill,
decode) and prints them."""
from __future__ import annotations

import asyncio
import json
import socket
import sys


def _response(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(data), data)


ANSWER = _response({"id": "cmpl-stub", "object": "text_completion", "created": 0, "model": "default",
                    "choices": [{"index": 0, "text": " ok", "finish_reason": "length", "logprobs": None}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
LOAD = _response({"role": "stub", "waiting_requests": 0, "running_requests": 0,
                  "transfer_requests": 0, "pending_tokens": 0})
INFO = _response({"bootstrap_port": 0})


class _Stub(asyncio.Protocol):
    """Keep-alive HTTP/1.1, one request at a time per connection, answered as soon as its body
    is in."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._need = 0          # bytes of the current request (head + body); 0: head not seen
        self._answer = ANSWER
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            if not self._need:
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self._buffer[:end]).lower()
                at = head.find(b"content-length:")
                length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
                self._need = end + 4 + length
                self._answer = (ANSWER if head.startswith(b"post") else
                                LOAD if b" /get_load " in head else INFO)
            if len(self._buffer) < self._need:
                return
            del self._buffer[:self._need]
            self._need = 0
            self.transport.write(self._answer)


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(_Stub, "127.0.0.1", 0) for _ in ("prefill", "decode")]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print("stub upstreams on ports %d %d" % tuple(ports), flush=True)
    await asyncio.Event().wait()  # until the bench terminates the process


if __name__ == "__main__":
    import uvloop

    try:
        uvloop.run(_serve())
    except KeyboardInterrupt:
        sys.exit(0)
