from __future__ import annotations

import asyncio
import socket

import pytest
import torch

from laps_agent.engine.pd.kv_codec import KVTransfer
from laps_agent.engine.pd.wire import BootstrapError, KVOutbox, RoomRefused, fetch_payload


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
        await asyncio.wait_for(fetch_payload("127.0.0.1", port, 99, timeout_s=0.5), 10)


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
