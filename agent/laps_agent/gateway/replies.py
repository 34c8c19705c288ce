"""What the PD proxy hands back to the app: a whole answer, or a stream to relay."""
from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass


@dataclass
class Reply:
    """A whole answer: the decode pod's (success or its own error), passed through."""
    status: int
    body: bytes
    content_type: str


@dataclass
class StreamReply:
    chunks: AsyncGenerator[bytes, None]  # starts with the decode pod's first chunk
    close: Callable[[], Awaitable[None]]  # idempotent clean-up (`chunks` runs it too)


def sse_error(message: str, kind: str = "upstream_error") -> bytes:
    return b"data: " + json.dumps({"error": {"message": message, "type": kind}}).encode() + b"\n\n"
