"""The bootstrap wire's frame: [4-byte big-endian header length][UTF-8 JSON header][raw bytes].

A prompt's KV runs to tens of MB, so neither side joins it into one bytes object: a codec may
hand the outbox a `Frame` (header + body buffers, e.g. the exported tensor's own memory) that
goes to the socket as it is, and the decode side reads a big body straight into one aligned
buffer (`body_buffer`, filled by pd_fetch). Torch-free: the emulated engine uses it too."""
from __future__ import annotations

import json
import mmap
import struct
from typing import Any, Union

# Bodies at least this big are read into one preallocated buffer (pd_fetch), not joined from pieces.
DIRECT_READ_BYTES = 1 << 20
# The decode side places the body at this alignment in its receive buffer, so a codec can view
# it as any dtype in place (torch needs element-aligned data).
BODY_ALIGN = 64


class BootstrapError(RuntimeError):
    """The hand-off failed (timeout, refused, corrupt payload)."""


class Frame:
    """One wire frame kept in parts: the length-prefixed header, then the body's buffers. The
    bootstrap port writes the parts to the socket one after the other (the same bytes as
    `encode_frame`), so a big body is never copied into a joined bytes object."""

    __slots__ = ("parts", "nbytes")

    def __init__(self, header: dict, *body: Any) -> None:  # body: C-contiguous buffers
        raw = json.dumps(header).encode()
        self.parts = (struct.pack(">I", len(raw)) + raw, *(memoryview(b).cast("B") for b in body))
        self.nbytes = sum(len(p) for p in self.parts)

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


# What a codec's encode returns and the outbox holds.
Payload = Union[bytes, Frame]


def encode_frame(header: dict, body: bytes = b"") -> bytes:
    return bytes(Frame(header, body))


def decode_frame(data: bytes | bytearray | memoryview) -> tuple[dict, memoryview]:
    """The header and a view of the body (no copy); `data` is any bytes-like object."""
    view = memoryview(data).cast("B")
    try:
        (size,) = struct.unpack(">I", view[:4])
        if 4 + size > len(view):
            raise ValueError(f"header of {size} bytes, only {len(view) - 4} follow")
        header = json.loads(bytes(view[4:4 + size]))
    except (struct.error, ValueError) as exc:
        raise BootstrapError(f"corrupt KV transfer payload: {exc}") from None
    if not isinstance(header, dict):
        raise BootstrapError("corrupt KV transfer payload: header is not an object")
    return header, view[4 + size:]


def body_buffer(pad: int, n: int) -> memoryview:
    """A fresh writable buffer for an n-byte body, starting `pad` bytes into its memory: an
    anonymous mmap, as it is not zero-filled up front (unlike bytearray(n)). (MADV_HUGEPAGE made
    no measurable difference to a whole fetch here, so it is not asked for.)"""
    return memoryview(mmap.mmap(-1, pad + n))[pad:]
