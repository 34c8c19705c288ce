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


class EventAligner:
    """Passes a relayed SSE byte stream on whole events only, holding back a partial one.

    The upstream's chunks are TCP reads, and an event can span two of them. Should the stream
    then end in an error event of ours (the deadline, a decode pod breaking off), that event
    must start on a boundary: glued to half an event, the client's SSE parser would see one
    event of broken JSON and raise a parse error instead of the reason."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of the stream so far ends on an event boundary and has not been passed on."""
        data = self._tail + chunk if self._tail else chunk
        # Blank-line boundaries (the SSE spec's LF LF and CRLF CRLF); `rfind` keeps the common
        # case, a chunk of whole events, one scan and no copy.
        lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if cut == len(data):
            self._tail = b""
            return data
        self._tail = data[cut:]
        return data[:cut]

    def rest(self) -> bytes:
        """The stream ended normally: what is held back is its last (unterminated) event."""
        rest, self._tail = self._tail, b""
        return rest
