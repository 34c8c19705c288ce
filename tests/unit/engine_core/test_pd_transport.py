from __future__ import annotations

import asyncio
import socket

import pytest
import torch

from laps_agent.engine.pd.kv_codec import BootstrapError, KVOutbox, KVTransfer, fetch_kv
from laps_agent.engine.pd.wire import RoomRefused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_transfer_round_trips_exactly(dtype):
    kv = torch.randn(2, 2, 5, 3, 4).to(dtype)
    back = KVTransfer.decode(KVTransfer(7, [1, 2, 3, 4, 5], 9, kv, {"rid": "x"}).encode())
    assert (back.room, back.input_ids, back.first_token, back.meta) == (7, [1, 2, 3, 4, 5], 9, {"rid": "x"})
    assert back.kv.dtype == dtype and torch.equal(back.kv, kv)


def test_corrupt_payload_is_a_bootstrap_error():
    good = KVTransfer(1, [1, 2], 3, torch.zeros(1, 2, 2, 1, 2)).encode()
    with pytest.raises(BootstrapError):
        KVTransfer.decode(good[:-4])
    with pytest.raises(BootstrapError):
        KVTransfer.decode(b"\x00\x00\x00\x05{nope")


@pytest.mark.parametrize("decode_first", [True, False])
async def test_outbox_pairs_a_room_whichever_side_comes_first(decode_first):
    outbox = KVOutbox(timeout_s=5)
    outbox.announce(42)  # the prefill request was accepted
    if decode_first:
        taker = asyncio.create_task(outbox.take(42, wait_s=5))
        await asyncio.sleep(0)  # one loop turn: the taker registers its interest (no timing involved)
        assert 42 in outbox._slots and len(outbox) == 0
        await outbox.hand_off(42, b"payload")
        assert await taker == b"payload"
    else:
        giver = asyncio.create_task(outbox.hand_off(42, b"payload"))
        await asyncio.sleep(0)
        assert len(outbox) == 1
        assert await outbox.take(42, wait_s=5) == b"payload"
        await giver
    assert len(outbox) == 0 and outbox._slots == {}


async def test_uncollected_room_is_dropped_after_the_timeout():
    outbox = KVOutbox(timeout_s=0.2)
    with pytest.raises(BootstrapError, match="within 0.2s"):
        await outbox.hand_off(5, b"x" * 1000)
    assert len(outbox) == 0 and outbox.pending_bytes() == 0
    with pytest.raises(RoomRefused) as refused:  # dropped: nothing left to give, and no wait
        await outbox.take(5, wait_s=5)
    assert refused.value.status == 410
    assert outbox._slots == {}


async def test_a_room_nobody_announced_gets_nothing():
    outbox = KVOutbox(timeout_s=5, grace_s=0.05)
    with pytest.raises(RoomRefused, match="not one this engine is serving") as refused:
        await asyncio.wait_for(outbox.take(7, wait_s=5), 2)  # the grace window, not wait_s
    assert refused.value.status == 404 and outbox._slots == {} and outbox._heralds == {}


async def test_a_room_already_delivered_gets_nothing():
    outbox = KVOutbox(timeout_s=5)
    outbox.announce(8)
    giver = asyncio.create_task(outbox.hand_off(8, b"secret"))
    assert await outbox.take(8, wait_s=5) == b"secret"
    await giver
    with pytest.raises(RoomRefused, match="already delivered") as refused:
        await asyncio.wait_for(outbox.take(8, wait_s=5), 2)
    assert refused.value.status == 410


async def test_a_request_announced_just_after_the_decode_side_asked_still_pairs():
    outbox = KVOutbox(timeout_s=5, grace_s=5)
    taker = asyncio.create_task(outbox.take(9, wait_s=5))
    await asyncio.sleep(0)  # the decode side's GET is in, before the prefill request was accepted
    outbox.announce(9)
    await outbox.hand_off(9, b"kv")
    assert await taker == b"kv"


async def test_bootstrap_app_answers_unknown_and_delivered_rooms_at_once():
    import httpx

    from laps_agent.engine.pd.wire import bootstrap_app

    outbox = KVOutbox(timeout_s=5, grace_s=0.05)
    transport = httpx.ASGITransport(app=bootstrap_app(outbox))
    async with httpx.AsyncClient(transport=transport, base_url="http://boot") as client:
        unknown = await client.get("/laps/kv/123", params={"wait": "30"})
        assert unknown.status_code == 404 and unknown.content.startswith(b"bootstrap_room 123 is not")
        outbox.announce(124)
        giver = asyncio.create_task(outbox.hand_off(124, b"kv-bytes"))
        first = await client.get("/laps/kv/124", params={"wait": "5"})
        await giver
        again = await client.get("/laps/kv/124", params={"wait": "30"})
    assert first.status_code == 200 and first.content == b"kv-bytes"
    assert again.status_code == 410 and b"kv-bytes" not in again.content


async def test_fetch_from_an_unreachable_prefill_engine_fails_in_bounded_time():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(BootstrapError, match="did not arrive"):
        await asyncio.wait_for(fetch_kv("127.0.0.1", port, 99, timeout_s=0.5), 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frame_is_the_same_bytes_as_the_joined_wire_format(dtype):
    import json
    import struct

    kv = torch.randn(2, 2, 3, 1, 4).to(dtype)
    transfer = KVTransfer(3, [1, 2, 3], 4, kv, {"cached_tokens": 2})
    header = {"room": 3, "input_ids": [1, 2, 3], "first_token": 4, "shape": [2, 2, 3, 1, 4],
              "dtype": str(dtype).removeprefix("torch."), "meta": {"cached_tokens": 2}}
    raw = json.dumps(header).encode()
    bits = kv.view(torch.int16) if dtype == torch.bfloat16 else kv
    expected = struct.pack(">I", len(raw)) + raw + bits.numpy().tobytes()
    frame = transfer.frame()
    assert bytes(frame) == transfer.encode() == expected and len(frame) == len(expected)


def test_a_payload_not_matching_its_header_is_a_clear_bootstrap_error():
    good = KVTransfer(1, [1, 2], 3, torch.zeros(1, 2, 2, 1, 2)).encode()
    with pytest.raises(BootstrapError, match="corrupt KV transfer payload"):
        KVTransfer.decode(memoryview(bytearray(good[:-4])))  # writable: the in-place path
    with pytest.raises(BootstrapError, match="corrupt KV transfer payload: header of"):
        KVTransfer.decode(good[:10])


# ---- the decode side's read (pd_fetch): a real socket ----------------------------------------

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
