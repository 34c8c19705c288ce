"""Prefill -> decode KV hand-off over the prefill engine's bootstrap port: the wire (torch-free).

The prefill engine parks each finished prefill (prompt KV + first token) in a `KVOutbox` under
its `bootstrap_room`; the decode engine that received the same request long-polls
`GET /laps/kv/{room}?wait=S` on `bootstrap_host:bootstrap_port` until it gets the bytes or its
deadline passes. Either side may arrive first. Anything not collected within the bootstrap
timeout is dropped, so a lost partner never pins memory.

Only rooms this engine is serving are answered: the prefill request announces its room when the
engine accepts it (`KVOutbox.announce`). A GET for a room nobody announced gets 404, one already
delivered (or dropped) 410, at once and with no bytes: the bootstrap port hands prompts' KV out,
so a guessed or replayed room must get nothing.

Wire format (one HTTP body): 4-byte big-endian header length, UTF-8 JSON header, raw bytes.
What the header and bytes hold is the codec's business: the builtin engine's tensors
(`pd.TensorKVCodec`), or the emulated engine's header-only stand-in.
The frame and its zero-join handling live in pd_frame.py."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from laps_agent.engine.pd import fetch as pd_fetch
from laps_agent.engine.pd.frame import BootstrapError, Frame, Payload, decode_frame, encode_frame  # noqa: F401
from laps_agent.engine.pd.prefix_warm import WARM_PATH

KV_PATH = "/laps/kv/{room}"
# The gateway sends a request to its prefill and decode engines at once, so the decode engine's
# GET may come a moment before the prefill engine has accepted (announced) the room. An unknown
# room is held this long for its announcement before the 404; the decode side keeps polling
# after a 404 until its bootstrap timeout, so an engine slower than this still pairs.
ANNOUNCE_GRACE_S = 1.0
# Set on a 404 for a room not announced (vs. a long poll that ended before the KV was ready, which
# the decode side repeats at once): the decode side backs off before asking again.
UNKNOWN_ROOM_HEADER = "x-laps-unknown-room"


class RoomRefused(Exception):
    """The outbox gives nothing for this room: `status` 404 (not announced here) or 410 (done)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class HandOff(Protocol):
    """What the decode side gets: the prompt as the prefill engine saw it, its first token and
    the KV (whatever the codec made of it)."""
    room: int
    input_ids: list[int]
    first_token: int
    kv: Any
    meta: dict      # what the prefill side sent along (`encode(meta=...)`), e.g. cached_tokens


class KVCodec(Protocol):
    # `meta` (a small JSON object, e.g. {"cached_tokens": n}) comes back as the HandOff's meta.
    # Callers pass it only when they have something to say, so codecs may leave it out.
    async def encode(self, room: int, input_ids: list[int], first_token: int, kv: Any,
                     meta: dict | None = None) -> Payload: ...
    # `payload`: what fetch_payload returned (bytes-like; a big one is a writable memoryview).
    async def decode(self, payload: bytes | memoryview) -> HandOff: ...


@dataclass
class _Slot:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    taken: asyncio.Event = field(default_factory=asyncio.Event)
    payload: Payload | None = None
    expires: float = 0.0


class KVOutbox:
    """Prefill side: rooms waiting for their decode engine. Lives on the server's event loop."""

    def __init__(self, timeout_s: float, grace_s: float = ANNOUNCE_GRACE_S) -> None:
        self.timeout_s, self.grace_s = timeout_s, grace_s
        self._slots: dict[int, _Slot] = {}
        # room -> expiry (monotonic). Expiry is insertion time + timeout_s, and an entry is moved
        # to the end when renewed, so the oldest is always first: pruning stops at the first live one.
        self._announced: dict[int, float] = {}
        self._done: dict[int, float] = {}          # delivered or dropped: 410 until it expires
        self._heralds: dict[int, asyncio.Event] = {}  # early GETs waiting for an announcement

    def __len__(self) -> int:
        return sum(1 for s in self._slots.values() if s.payload is not None)

    def pending_bytes(self) -> int:
        return sum(len(s.payload) for s in self._slots.values() if s.payload is not None)

    def announce(self, room: int) -> None:
        """A request this engine accepted will produce `room`'s KV: decode engines may ask for it.
        Lapses after the bootstrap timeout (the decode side has given up by then), so a request
        that fails before its hand-off leaves nothing behind."""
        now = time.monotonic()
        _prune(self._announced, now)
        self._announced.pop(room, None)
        self._announced[room] = now + self.timeout_s
        herald = self._heralds.get(room)
        if herald is not None:
            herald.set()

    def _finish(self, room: int) -> None:
        now = time.monotonic()
        self._announced.pop(room, None)
        _prune(self._done, now)
        self._done[room] = now + self.timeout_s

    async def hand_off(self, room: int, payload: Payload) -> None:
        """Park the payload and wait until a decode engine took it; BootstrapError after the timeout
        (the payload is dropped then)."""
        if room in self._done and self._done[room] > time.monotonic():
            raise BootstrapError(f"bootstrap_room {room} was already handed off")
        slot = self._slots.setdefault(room, _Slot())
        if slot.payload is not None or slot.taken.is_set():
            raise BootstrapError(f"bootstrap_room {room} is already in use")
        self.announce(room)  # renews it: the decode side is owed a whole timeout from here
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
            self._finish(room)

    async def _check(self, room: int, wait_s: float) -> None:
        """RoomRefused unless `room` is announced here (waiting up to the grace window for it)."""
        now = time.monotonic()
        if self._done.get(room, 0.0) > now:
            raise RoomRefused(410, f"bootstrap_room {room} was already delivered or dropped")
        if self._announced.get(room, 0.0) > now:
            return
        herald = self._heralds.setdefault(room, asyncio.Event())
        try:
            await asyncio.wait_for(herald.wait(), min(max(wait_s, 0.0), self.grace_s))
        except asyncio.TimeoutError:
            raise RoomRefused(404, f"bootstrap_room {room} is not one this engine is serving "
                                   "(no request announced it)") from None
        finally:
            if self._heralds.get(room) is herald:
                del self._heralds[room]

    async def take(self, room: int, wait_s: float) -> Payload | None:
        """Decode side asking: the payload, or None if it did not arrive within wait_s; RoomRefused
        for a room this engine is not serving (unknown, or already delivered)."""
        started = time.monotonic()
        await self._check(room, wait_s)
        wait_s -= time.monotonic() - started
        slot = self._slots.setdefault(room, _Slot())
        try:
            await asyncio.wait_for(slot.ready.wait(), max(wait_s, 0.0))
        except asyncio.TimeoutError:
            if self._slots.get(room) is slot and slot.payload is None:
                del self._slots[room]  # nobody produced it yet; a later poll makes a fresh slot
            return None
        payload, slot.payload = slot.payload, None
        if payload is None:  # another poller took it first
            raise RoomRefused(410, f"bootstrap_room {room} was already delivered")
        slot.taken.set()
        self._finish(room)
        return payload


def _prune(expiries: dict[int, float], now: float) -> None:
    while expiries:
        room = next(iter(expiries))
        if expiries[room] > now:
            return
        del expiries[room]


def bootstrap_app(outbox: KVOutbox, warm: Callable[[bytes], tuple[int, str]] | None = None):
    """The ASGI app served on --bootstrap-port; `warm` takes prefix warms' bodies (prefix_warm.py;
    None: this engine takes none, 404)."""
    from fastapi import FastAPI, Query, Response

    class _FrameResponse(Response):
        """Sends a Frame's parts as they are: the transport writes each buffer without joining."""

        def __init__(self, frame: Frame) -> None:
            super().__init__(headers={"content-length": str(len(frame))},
                             media_type="application/octet-stream")
            self.frame = frame

        async def __call__(self, scope, receive, send) -> None:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            parts = self.frame.parts
            for i, part in enumerate(parts):
                await send({"type": "http.response.body", "body": part,
                            "more_body": i < len(parts) - 1})

    app = FastAPI(title="laps engine bootstrap", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "pending_rooms": len(outbox)}

    @app.get(KV_PATH)
    async def kv(room: int, wait: float = Query(5.0, ge=0.0, le=60.0)) -> Response:
        try:
            payload = await outbox.take(room, wait)
        except RoomRefused as exc:
            return Response(status_code=exc.status, content=exc.message,
                            headers={UNKNOWN_ROOM_HEADER: "1"} if exc.status == 404 else None)
        if payload is None:
            return Response(status_code=404, content=f"bootstrap_room {room} not ready")
        if isinstance(payload, Frame):
            return _FrameResponse(payload)
        return Response(content=payload, media_type="application/octet-stream")

    async def take_warm(request) -> Response:  # a plain Starlette route: the body is read raw
        if warm is None:
            return Response(status_code=404, content="prefix warming is off on this engine (--prefix-warm)")
        status, message = warm(await request.body())
        return Response(status_code=status, content=message)

    app.router.add_route(WARM_PATH, take_warm, methods=["POST"])

    return app


async def fetch_payload(host: str, port: int, room: int, timeout_s: float, *,
                        poll_s: float = 5.0) -> bytes | memoryview:
    """Decode side: long-poll the prefill engine until the room's payload arrives or timeout_s
    passes. Each GET goes over its own connection (`pd_fetch.get`), which reads a big body
    straight from the socket into its final buffer and returns it as a writable memoryview."""
    deadline = time.monotonic() + timeout_s
    path = KV_PATH.format(room=room)
    backoff = 0.05
    last_error = "not ready"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BootstrapError(
                f"KV for bootstrap_room {room} did not arrive from {host}:{port} within "
                f"{timeout_s:g}s ({last_error})")
        wait = min(poll_s, left)
        try:
            resp = await pd_fetch.get(host, port, f"{path}?wait={wait:.3f}", wait + 10.0)
            if resp.status_code == 200:
                return resp.body
        except httpx.HTTPError as exc:
            # Prefill engine not reachable (yet), or the connection broke mid-body: retry
            # until the deadline (a room already delivered answers 410 then). pd_fetch raises
            # httpx's exception types, with httpx's wording, for these.
            last_error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(min(backoff, max(deadline - time.monotonic(), 0)))
            backoff = min(backoff * 2, 1.0)
            continue
        if resp.status_code == 410:  # delivered to someone else: waiting cannot help
            raise BootstrapError(f"bootstrap_room {room} at {host}:{port}: {resp.text}")
        last_error = f"HTTP {resp.status_code}: {resp.text}"
        if UNKNOWN_ROOM_HEADER in resp.headers:  # not announced yet (ANNOUNCE_GRACE_S)
            await asyncio.sleep(min(backoff, max(deadline - time.monotonic(), 0)))
            backoff = min(backoff * 2, 1.0)
