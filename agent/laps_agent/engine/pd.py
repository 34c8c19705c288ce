"""Prefill -> decode KV hand-off over the prefill engine's bootstrap port.

The prefill engine parks each finished prefill (prompt KV + first token) in a `KVOutbox` under
its `bootstrap_room`; the decode engine that received the same request long-polls
`GET /laps/kv/{room}?wait=S` on `bootstrap_host:bootstrap_port` until it gets the bytes or its
deadline passes. Either side may arrive first. Anything not collected within the bootstrap
timeout is dropped, so a lost partner never pins memory.

Wire format (one HTTP body): 4-byte big-endian header length, UTF-8 JSON header, raw tensor
bytes (C order, dtype and shape in the header)."""
from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from dataclasses import dataclass, field

import httpx
import torch

log = logging.getLogger(__name__)

KV_PATH = "/laps/kv/{room}"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class BootstrapError(RuntimeError):
    """The hand-off failed (timeout, refused, corrupt payload)."""


@dataclass
class KVTransfer:
    room: int
    input_ids: list[int]
    first_token: int
    kv: torch.Tensor                        # CPU [layers, 2, len(input_ids), kv_heads, head_dim]
    meta: dict = field(default_factory=dict)

    def encode(self) -> bytes:
        kv = self.kv.detach().to("cpu").contiguous()
        dtype = str(kv.dtype).removeprefix("torch.")
        header = {"room": self.room, "input_ids": self.input_ids, "first_token": self.first_token,
                  "shape": list(kv.shape), "dtype": dtype, "meta": self.meta}
        raw = json.dumps(header).encode()
        # bfloat16 has no numpy dtype: ship its bits as int16.
        body = kv.view(torch.int16).numpy().tobytes() if dtype == "bfloat16" else kv.numpy().tobytes()
        return struct.pack(">I", len(raw)) + raw + body

    @classmethod
    def decode(cls, data: bytes) -> "KVTransfer":
        try:
            (size,) = struct.unpack(">I", data[:4])
            header = json.loads(data[4:4 + size])
            dtype = _DTYPES[header["dtype"]]
            payload = bytearray(data[4 + size:])
            flat = torch.frombuffer(payload, dtype=torch.int16 if dtype == torch.bfloat16 else dtype)
            kv = flat.view(dtype).reshape(header["shape"])
        except (struct.error, ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise BootstrapError(f"corrupt KV transfer payload: {exc}") from None
        if kv.shape[2] != len(header["input_ids"]):
            raise BootstrapError("KV length does not match the prompt length")
        return cls(room=int(header["room"]), input_ids=list(header["input_ids"]),
                   first_token=int(header["first_token"]), kv=kv, meta=header.get("meta", {}))


@dataclass
class _Slot:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    taken: asyncio.Event = field(default_factory=asyncio.Event)
    payload: bytes | None = None
    expires: float = 0.0


class KVOutbox:
    """Prefill side: rooms waiting for their decode engine. Lives on the server's event loop."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._slots: dict[int, _Slot] = {}

    def __len__(self) -> int:
        return sum(1 for s in self._slots.values() if s.payload is not None)

    def pending_bytes(self) -> int:
        return sum(len(s.payload) for s in self._slots.values() if s.payload is not None)

    async def hand_off(self, room: int, payload: bytes) -> None:
        """Park the payload and wait until a decode engine took it; BootstrapError after the timeout
        (the payload is dropped then)."""
        slot = self._slots.setdefault(room, _Slot())
        if slot.payload is not None or slot.taken.is_set():
            raise BootstrapError(f"bootstrap_room {room} is already in use")
        slot.payload, slot.expires = payload, time.monotonic() + self.timeout_s
        slot.ready.set()
        try:
            await asyncio.wait_for(slot.taken.wait(), self.timeout_s)
        except asyncio.TimeoutError:
            raise BootstrapError(
                f"no decode engine collected bootstrap_room {room} within {self.timeout_s:g}s") from None
        finally:
            if self._slots.get(room) is slot:
                del self._slots[room]

    async def take(self, room: int, wait_s: float) -> bytes | None:
        """Decode side asking: the payload, or None if it did not arrive within wait_s."""
        slot = self._slots.setdefault(room, _Slot())
        try:
            await asyncio.wait_for(slot.ready.wait(), max(wait_s, 0.0))
        except asyncio.TimeoutError:
            if self._slots.get(room) is slot and slot.payload is None:
                del self._slots[room]  # nobody produced it yet; a later poll makes a fresh slot
            return None
        payload, slot.payload = slot.payload, None
        if payload is None:  # another poller took it first
            return None
        slot.taken.set()
        return payload


def bootstrap_app(outbox: KVOutbox):
    """The ASGI app served on --bootstrap-port."""
    from fastapi import FastAPI, Query, Response

    app = FastAPI(title="laps engine bootstrap", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "pending_rooms": len(outbox)}

    @app.get(KV_PATH)
    async def kv(room: int, wait: float = Query(5.0, ge=0.0, le=60.0)) -> Response:
        payload = await outbox.take(room, wait)
        if payload is None:
            return Response(status_code=404, content=f"bootstrap_room {room} not ready")
        return Response(content=payload, media_type="application/octet-stream")

    return app


async def fetch_kv(host: str, port: int, room: int, timeout_s: float, *,
                   client: httpx.AsyncClient | None = None, poll_s: float = 5.0) -> KVTransfer:
    """Decode side: long-poll the prefill engine until the room's KV arrives or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    url = f"http://{_host_for_url(host)}:{port}{KV_PATH.format(room=room)}"
    own = client is None
    client = client or httpx.AsyncClient()
    backoff = 0.05
    last_error = "not ready"
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BootstrapError(
                    f"KV for bootstrap_room {room} did not arrive from {host}:{port} within "
                    f"{timeout_s:g}s ({last_error})")
            wait = min(poll_s, left)
            try:
                resp = await client.get(url, params={"wait": f"{wait:.3f}"}, timeout=wait + 10.0)
            except httpx.HTTPError as exc:
                # Prefill engine not reachable (yet): retry until the deadline.
                last_error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(min(backoff, max(deadline - time.monotonic(), 0)))
                backoff = min(backoff * 2, 1.0)
                continue
            if resp.status_code == 200:
                transfer = await asyncio.to_thread(KVTransfer.decode, resp.content)  # big copy: off the loop
                if transfer.room != room:
                    raise BootstrapError(f"asked for room {room}, got {transfer.room}")
                return transfer
            last_error = f"HTTP {resp.status_code}"
    finally:
        if own:
            await client.aclose()


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
