from __future__ import annotations

import asyncio
import socket

import pytest
import torch

from laps_agent.engine.pd import BootstrapError, KVOutbox, KVTransfer, fetch_kv


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
    assert await outbox.take(5, wait_s=0) is None
    assert outbox._slots == {}


async def test_fetch_from_an_unreachable_prefill_engine_fails_in_bounded_time():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(BootstrapError, match="did not arrive"):
        await asyncio.wait_for(fetch_kv("127.0.0.1", port, 99, timeout_s=0.5), 10)
