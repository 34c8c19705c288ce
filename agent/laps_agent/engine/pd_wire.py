"""Prefill -> decode KV hand-off over the prefill engine's bootstrap port: the wire (torch-free).

The prefill engine parks each finished prefill (prompt KV + first token) in a `KVOutbox` under
its `bootstrap_room`; the decode engine that received the same request long-polls
`GET /laps/kv/{room}?wait=S` on `bootstrap_host:bootstrap_port` until it gets the bytes or its
deadline passes. Either side may arrive first. Anything not collected within the bootstrap
timeout is dropped, so a lost partner never pins memory.

Wire format (one HTTP body): 4-byte big-endian header length, UTF-8 JSON header, raw bytes.
What the header and bytes hold is the codec's business: the builtin engine's tensors
(`pd.TensorKVCodec`), or the emulated engine's header-only stand-in."""
from __future__ import annotations

import asyncio
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

KV_PATH = "/laps/kv/{room}"


class BootstrapError(RuntimeError):
    """The hand-off failed (timeout, refused, corrupt payload)."""


def encode_frame(header: dict, body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack(">I", len(raw)) + raw + body


def decode_frame(data: bytes) -> tuple[dict, memoryview]:
    try:
        (size,) = struct.unpack(">I", data[:4])
        header = json.loads(data[4:4 + size])
    except (struct.error, ValueError) as exc:
        raise BootstrapError(f"corrupt KV transfer payload: {exc}") from None
    if not isinstance(header, dict):
        raise BootstrapError("corrupt KV transfer payload: header is not an object")
    return header, memoryview(data)[4 + size:]


class HandOff(Protocol):
    """What the decode side gets: the prompt as the prefill engine saw it, its first token and
    the KV (whatever the codec made of it)."""
    room: int
    input_ids: list[int]
    first_token: int
    kv: Any


class KVCodec(Protocol):
    async def encode(self, room: int, input_ids: list[int], first_token: int, kv: Any) -> bytes: ...
    async def decode(self, payload: bytes) -> HandOff: ...


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


async def fetch_payload(host: str, port: int, room: int, timeout_s: float, *,
                        client: httpx.AsyncClient | None = None, poll_s: float = 5.0) -> bytes:
    """Decode side: long-poll the prefill engine until the room's payload arrives or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    url = f"http://{_host_for_url(host)}:{port}{KV_PATH.format(room=room)}"
    own = client is None
    client = client or httpx.AsyncClient(trust_env=False)
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
                return resp.content
            last_error = f"HTTP {resp.status_code}"
    finally:
        if own:
            await client.aclose()


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
