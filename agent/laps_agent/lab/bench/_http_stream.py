"""The response parser of the load generator's streaming client: one `asyncio.Protocol` per
connection that parses in `data_received` (status line and headers, chunked or sized bodies, SSE
`data:` events) and stamps the arrival of every event carrying content. See `_client`."""
from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

_MAX_ERROR_BODY = 64 * 1024
_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(7)


@dataclass
class StreamOutcome:
    status: int = 0                    # 0: no response
    error: str | None = None
    sent_at: float = 0.0               # perf_counter when the request was written
    end_at: float = 0.0
    content_at: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    done_marker: bool = False          # saw `data: [DONE]`
    body: bytes | None = None          # the body of a non-stream answer (GETs, errors)
    cached_tokens: int | None = None   # usage.prompt_tokens_details.cached_tokens, when the server says
    # The answer's text pieces, collected only when the caller sets a list (a conversation turn
    # whose answer the next turn re-sends); None keeps the per-event cost of plain requests.
    text: list[str] | None = None


class _Retry(Exception):
    """A reused keep-alive connection closed before any response byte: resend on a new one."""


def _error_message(body: bytes, status: int) -> str:
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(doc, dict) and doc.get("detail"):
            return str(doc["detail"])[:300]
    except (ValueError, AttributeError):
        pass
    text = body.decode(errors="replace").strip()
    return text[:300] or f"HTTP {status}"


class _Conn(asyncio.Protocol):
    """One connection; parses the response of the exchange in flight."""

    def __init__(self, client: Any):
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.buf = bytearray()
        self.state = _DONE
        self.outcome: StreamOutcome | None = None
        self.waiter: asyncio.Future | None = None
        self.sse = False
        self.collect: bytearray | None = None
        self.lines = bytearray()
        self.remaining = 0
        self.keep_alive = True
        self.got_bytes = False
        self.reused = False
        self.expect_stream = True

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.client._all.discard(self)
        if self.state == _UNTIL_CLOSE:
            self._finish(None)
        elif self.state != _DONE:
            if self.reused and not self.got_bytes:
                self._fail_with(_Retry())
            else:
                self._finish(f"connection closed by the server{f': {exc}' if exc else ''}")

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.got_bytes = True
        if self.state == _DONE:
            return  # bytes after a finished exchange: nothing to attribute them to
        self.buf += data
        try:
            self._parse(now)
        except (ValueError, IndexError) as exc:
            self.keep_alive = False
            self._finish(f"malformed HTTP response: {exc}")

    # -- exchange
    def start(self, request: bytes, outcome: StreamOutcome, waiter: asyncio.Future, expect_stream: bool) -> None:
        self.outcome, self.waiter, self.expect_stream = outcome, waiter, expect_stream
        self.state, self.sse, self.collect, self.got_bytes = _HEAD, False, None, False
        self.buf.clear()
        self.lines.clear()
        outcome.sent_at = time.perf_counter()
        self.transport.write(request)

    def abort(self, message: str) -> None:
        if self.state != _DONE:
            self.keep_alive = False
            self._finish(message)
            self.transport.abort()

    def _fail_with(self, exc: Exception) -> None:
        self.state = _DONE
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def _finish(self, error: str | None) -> None:
        if self.state == _DONE:
            return
        self.state = _DONE
        out = self.outcome
        out.end_at = time.perf_counter()
        if error is None and self.collect is not None:
            out.body = body = bytes(self.collect)
            if out.status != 200:
                error = _error_message(body, out.status)
            elif self.expect_stream:
                self._plain_body(body)
        if error is None and out.status == 200 and self.sse and not out.done_marker and out.error is None:
            error = "stream ended without [DONE]"
        if error is not None and out.error is None:
            out.error = error
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(out)
        if self.keep_alive and not self.closed:
            self.client._release(self)
        elif not self.closed:
            self.transport.close()

    def _parse(self, now: float) -> None:
        buf = self.buf
        while True:
            if self.state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                self._head(bytes(buf[:end]))
                del buf[:end + 4]
            elif self.state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
                del buf[:end + 2]
                if size == 0:
                    self.state = _TRAILER
                    continue
                self.remaining, self.state = size, _CHUNK_DATA
            elif self.state == _CHUNK_DATA:
                if len(buf) < self.remaining + 2:
                    return
                self._body(bytes(buf[:self.remaining]), now)
                del buf[:self.remaining + 2]
                self.state = _CHUNK_SIZE
            elif self.state == _TRAILER:
                # the empty line after the last chunk (or trailer fields, then an empty line)
                if buf.startswith(b"\r\n"):
                    del buf[:2]
                else:
                    end = buf.find(b"\r\n\r\n")
                    if end < 0:
                        return
                    del buf[:end + 4]
                self._finish(None)
                return
            elif self.state == _LENGTH:
                take = min(len(buf), self.remaining)
                if take:
                    self._body(bytes(buf[:take]), now)
                    del buf[:take]
                    self.remaining -= take
                if self.remaining == 0:
                    self._finish(None)
                return
            elif self.state == _UNTIL_CLOSE:
                if buf:
                    self._body(bytes(buf), now)
                    buf.clear()
                return
            else:
                return

    def _head(self, head: bytes) -> None:
        lines = head.lstrip(b"\r\n").split(b"\r\n")
        self.outcome.status = status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        self.keep_alive = headers.get(b"connection") != b"close"
        self.sse = status == 200 and headers.get(b"content-type", b"").startswith(b"text/event-stream")
        if not self.sse:
            self.collect = bytearray()
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            self.state = _CHUNK_SIZE
        elif b"content-length" in headers:
            self.remaining = int(headers[b"content-length"])
            self.state = _LENGTH
            if self.remaining == 0:
                self._finish(None)
        else:
            self.keep_alive = False
            self.state = _UNTIL_CLOSE

    def _body(self, data: bytes, now: float) -> None:
        if not self.sse:
            if len(self.collect) < _MAX_ERROR_BODY or self.outcome.status == 200:
                self.collect += data
            return
        self.lines += data
        end = self.lines.rfind(b"\n")
        if end < 0:
            return
        complete = bytes(self.lines[:end])
        del self.lines[:end + 1]
        for line in complete.split(b"\n"):
            if line.startswith(b"data:"):
                self._event(line[5:].strip(), now)

    def _event(self, payload: bytes, now: float) -> None:
        out = self.outcome
        if payload == b"[DONE]":
            out.done_marker = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            out.error = out.error or f"undecodable SSE event: {payload[:100]!r}"
            return
        if not isinstance(event, dict):
            return
        if event.get("error"):
            err = event["error"]
            out.error = out.error or str(err.get("message") if isinstance(err, dict) else err)
            return
        for choice in event.get("choices") or ():
            text = choice.get("text")
            if text is None:
                delta = choice.get("delta") or {}
                text = delta.get("content") or delta.get("reasoning_content")
            if text:
                out.content_at.append(now)
                if out.text is not None:
                    out.text.append(text)
                break
        usage = event.get("usage")
        if usage:
            _usage(out, usage)

    def _plain_body(self, body: bytes) -> None:
        """A 200 answer that is not an event stream (the server ignored `stream`)."""
        out = self.outcome
        try:
            doc = json.loads(body)
            choice = (doc.get("choices") or [{}])[0]
            text = choice.get("text") or (choice.get("message") or {}).get("content")
            if text:
                out.content_at.append(out.end_at)
                if out.text is not None:
                    out.text.append(text)
            _usage(out, doc.get("usage") or {})
        except (ValueError, AttributeError, IndexError):
            out.error = "200 answer that is neither an event stream nor JSON"
        out.done_marker = True


def _usage(out: StreamOutcome, usage: dict) -> None:
    """prompt_tokens and, where the server reports them, the cached ones (OpenAI's
    prompt_tokens_details; null or absent on servers without a prefix cache report)."""
    if not isinstance(usage, dict):
        return
    if usage.get("prompt_tokens") is not None:
        out.prompt_tokens = int(usage["prompt_tokens"])
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        out.cached_tokens = int(details["cached_tokens"])
