"""The KV hand-off over real loopback sockets: the bootstrap port (uvicorn) and the decode side's
fetch against servers that misbehave on the wire. The wire's logic without sockets is
tests/unit/engine_core/test_pd_transport.py."""
from __future__ import annotations

import asyncio
import socket

import pytest
import torch

from laps_agent.engine.pd.kv_codec import KVTransfer
from laps_agent.engine.pd.wire import BootstrapError, KVOutbox


async def _serve(app_or_answers):
    """A server on a loopback port: uvicorn running `app`, or, given a list of raw answers, one
    that answers the n-th GET with the n-th (bytes, or a callable given the writer). Bound before
    it serves, so a client may connect at once (the backlog holds it): no waiting for startup."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    seen: list[bytes] = []
    if isinstance(app_or_answers, list):
        answers = app_or_answers

        async def handle(reader, writer):
            seen.append(await reader.readuntil(b"\r\n\r\n"))
            answer = answers[min(len(seen), len(answers)) - 1]
            writer.write(answer)
            await writer.drain()
            writer.close()

        sock.listen()
        server = await asyncio.start_server(handle, sock=sock)

        async def close():
            server.close()
        return port, seen, close
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app_or_answers, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def stop():
        server.should_exit = True
        await task
    return port, seen, stop


def _answer(status: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{head}\r\n".encode() + body


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
async def test_a_big_frame_from_the_bootstrap_port_arrives_intact_and_aligned(dtype):
    from laps_agent.engine.pd.wire import bootstrap_app, fetch_payload

    kv = torch.randn(2, 2, 700, 3, 64).to(dtype)  # over DIRECT_READ_BYTES in either dtype
    outbox = KVOutbox(timeout_s=5)
    outbox.announce(12)
    port, _, stop = await _serve(bootstrap_app(outbox))
    try:
        giver = asyncio.create_task(outbox.hand_off(12, KVTransfer(12, list(range(700)), 1, kv).frame()))
        payload = await fetch_payload("127.0.0.1", port, 12, timeout_s=10)
        await giver
    finally:
        await stop()
    assert isinstance(payload, memoryview) and not payload.readonly
    back = KVTransfer.decode(payload)
    assert back.room == 12 and back.input_ids == list(range(700))
    assert back.kv.dtype == dtype and torch.equal(back.kv, kv)
    # Viewed in place: the tensor's memory is the received buffer's, not a copy of it.
    body_at = torch.frombuffer(payload, dtype=torch.uint8).data_ptr() + len(payload) - kv.nbytes
    assert back.kv.data_ptr() == body_at and body_at % 64 == 0


async def test_a_connection_closed_mid_body_is_retried_like_any_broken_connection():
    from laps_agent.engine.pd.wire import fetch_payload

    good = KVTransfer(1, list(range(700)), 3, torch.zeros(2, 2, 700, 3, 64)).encode()
    cut = _answer("200 OK", good)[:-1000]  # the whole head, then the connection ends mid-body
    gone = _answer("410 Gone", b"bootstrap_room 1 was already delivered or dropped")
    port, seen, stop = await _serve([cut, gone])
    try:  # the retry gets the room's 410, as it would after httpx's RemoteProtocolError
        expected = f"bootstrap_room 1 at 127.0.0.1:{port}: .*already delivered"
        with pytest.raises(BootstrapError, match=expected):
            await fetch_payload("127.0.0.1", port, 1, timeout_s=10)
    finally:
        await stop()
    assert len(seen) == 2


async def test_a_body_that_never_arrives_whole_ends_at_the_deadline_naming_the_cause():
    from laps_agent.engine.pd.wire import fetch_payload

    good = KVTransfer(1, list(range(700)), 3, torch.zeros(2, 2, 700, 3, 64)).encode()
    port, seen, stop = await _serve([_answer("200 OK", good)[:-1000]])
    try:
        with pytest.raises(BootstrapError, match=r"did not arrive .*RemoteProtocolError: peer closed "
                                                 rf"connection .*expected {len(good)}"):
            await fetch_payload("127.0.0.1", port, 1, timeout_s=0.3)
    finally:
        await stop()
    assert len(seen) >= 1


@pytest.mark.parametrize("big", [False, True])
async def test_an_unknown_room_then_not_ready_then_the_payload(big):
    from laps_agent.engine.pd.wire import UNKNOWN_ROOM_HEADER, fetch_payload

    body = KVTransfer(4, [1, 2], 3, torch.zeros(2, 2, 700 if big else 2, 3, 64)).encode()
    port, seen, stop = await _serve([
        _answer("404 Not Found", b"bootstrap_room 4 is not one this engine is serving",
                f"{UNKNOWN_ROOM_HEADER}: 1"),
        _answer("404 Not Found", b"bootstrap_room 4 not ready"),
        _answer("200 OK", body)])
    try:
        payload = await fetch_payload("127.0.0.1", port, 4, timeout_s=10, poll_s=2)
    finally:
        await stop()
    assert bytes(payload) == body and isinstance(payload, memoryview) == big
    assert [s.split(b" ")[1] for s in seen] == [b"/laps/kv/4?wait=2.000"] * 3


async def test_a_chunked_answer_is_read_whole():
    from laps_agent.engine.pd.wire import fetch_payload

    body = KVTransfer(5, [1], 2, torch.randn(2, 2, 700, 3, 64)).encode()
    step = 300_000
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + step]), body[i:i + step])
                      for i in range(0, len(body), step))
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    port, _, stop = await _serve([head + chunks + b"0\r\n\r\n"])
    try:
        payload = await fetch_payload("127.0.0.1", port, 5, timeout_s=10)
    finally:
        await stop()
    assert bytes(payload) == body
