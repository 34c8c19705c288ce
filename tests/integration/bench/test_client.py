"""The load client against a real loopback HTTP server that writes its answers in awkward pieces:
chunks that split SSE events, several events in one chunk, byte-by-byte writes, keep-alive reuse."""
from __future__ import annotations

import asyncio
import json

from laps_agent.lab.bench._client import StreamClient


def _event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


STREAM = (_event({"choices": [{"text": ""}]})            # empty content: not a token
          + _event({"choices": [{"text": "Hel"}]}) + _event({"choices": [{"delta": {"content": "lo"}}]})
          + _event({"choices": [], "usage": {"prompt_tokens": 17}}) + b"data: [DONE]\n\n")
ERROR_EVENT = _event({"choices": [{"text": "x"}]}) + _event({"error": {"message": "engine died"}})


def _chunked(body: bytes, cuts: list[int]) -> bytes:
    out, last = b"", 0
    for cut in [*cuts, len(body)]:
        piece = body[last:cut]
        out += b"%x;ext=1\r\n%s\r\n" % (len(piece), piece)
        last = cut
    return out + b"0\r\n\r\n"


CONNECTIONS: list[object] = []


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    CONNECTIONS.append(writer)
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            writer.close()
            return
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]) if b"content-length" in head else 0
        body = json.loads(await reader.readexactly(length)) if length else {}
        if body.get("kind") == "bad":
            payload = json.dumps({"error": {"message": "prompt too long", "type": "invalid_request_error"}}).encode()
            response = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
                len(payload), payload)
        else:
            events = ERROR_EVENT if body.get("kind") == "sse-error" else STREAM
            # chunk borders inside an event, inside "data:", and several events in one chunk
            response = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                        + _chunked(events, [3, 40, 41, 90]))
        for i in range(0, len(response), 7):  # tiny writes: the client sees arbitrary fragments
            writer.write(response[i:i + 7])
            await writer.drain()
            await asyncio.sleep(0)


async def test_fragmented_streams_errors_and_keep_alive():
    CONNECTIONS.clear()
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = StreamClient(f"http://127.0.0.1:{port}/v1")
    try:
        ok = await client.stream("/v1/completions", {"kind": "ok"}, timeout=10)
        assert (ok.status, ok.error, ok.done_marker, ok.prompt_tokens) == (200, None, True, 17)
        assert len(ok.content_at) == 2 and ok.sent_at <= ok.content_at[0] <= ok.content_at[1] <= ok.end_at

        bad = await client.stream("/v1/completions", {"kind": "bad"}, timeout=10)
        assert (bad.status, bad.error) == (400, "prompt too long")

        failed = await client.stream("/v1/completions", {"kind": "sse-error"}, timeout=10)
        assert (failed.status, failed.error, len(failed.content_at)) == (200, "engine died", 1)

        again = await client.stream("/v1/completions", {"kind": "ok"}, timeout=10)
        assert again.error is None and len(again.content_at) == 2
        assert len(CONNECTIONS) == 1  # one keep-alive connection served all four
    finally:
        client.close()
        server.close()
        await server.wait_closed()
