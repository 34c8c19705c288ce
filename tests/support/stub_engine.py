"""A test double of a PD engine: the builtin engine's HTTP protocol (prefill answers once
"prefilled", decode answers OpenAI/SGLang-shaped text), no scheduler and no compute, plus what
only tests need: gates that hold a prefill until the test releases it, injected delays, a record
of every request it saw (`/stub/requests`) and of abandoned calls. Everything that needs a real
engine without a model uses the emulated engine (`laps engine --backend emulated`) instead.

Run as a process: `python -m tests.support.stub_engine --role decode --port 0`; it prints
`LISTENING <port>` once accepting."""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import threading
import time

_DONE = b"data: [DONE]\n\n"
_GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")


class KVHandoff:
    """Stands in for the bootstrap channel between in-process stub engines: a decode stub sharing
    one with the prefill stubs answers a room only after a prefill stub has finished it, as a
    real decode engine waits for the KV of its room."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self._rooms: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self.timeout_s = timeout_s

    def _event(self, room: int) -> threading.Event:
        with self._lock:
            return self._rooms.setdefault(room, threading.Event())

    def send(self, room: int) -> None:
        self._event(room).set()

    async def receive(self, room: int) -> bool:
        event = self._event(room)
        arrived = event.is_set() or await asyncio.to_thread(event.wait, self.timeout_s)
        with self._lock:
            self._rooms.pop(room, None)
        return arrived


class StubEngine:
    """Raw ASGI app (no framework) so its own overhead stays far below the gateway's."""

    def __init__(self, role: str, *, model: str = "default", bootstrap_port: int | None = 8998,
                 prefill_group: str | None = None, prefill_delay_s: float = 0.0,
                 token_delay_s: float = 0.0, first_token_delay_s: float = 0.0,
                 max_tokens_cap: int = 16, handoff: KVHandoff | None = None,
                 prefill_gate: threading.Event | None = None, split_events: bool = False) -> None:
        self.role, self.model, self.bootstrap_port = role, model, bootstrap_port
        self.prefill_group, self.prefill_delay_s = prefill_group, prefill_delay_s
        self.token_delay_s, self.max_tokens_cap = token_delay_s, max_tokens_cap
        # Stands in for a decode engine waiting for the KV hand-off before its first token.
        self.first_token_delay_s = first_token_delay_s
        self.handoff = handoff
        self.prefill_gate = prefill_gate  # when given, prefill finishes only once it is set
        # When set, every streamed event goes out in two writes with token_delay_s between them
        # (an event spanning two TCP reads), so a stream is mid-event nearly all the time.
        self.split_events = split_events
        self.requests: collections.deque[dict] = collections.deque(maxlen=10_000)
        self.disconnects = 0  # generations the client (the gateway) abandoned midway
        # When set, every generation is refused with 503 and this error type, as a real engine
        # refuses while draining ("draining") or with its queue at its bound ("queue_full").
        self.refusal: str | None = None
        self.refused = 0
        # When set, (status, content type, body) answers every generation: what an engine's HTTP
        # server writes when its app crashed (uvicorn: 500 text/plain "Internal Server Error"),
        # or a proxy in front of an engine (an HTML 502 page).
        self.failure: tuple[int, str, bytes] | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path, method = scope["path"], scope["method"]
        if method == "POST" and path in _GENERATION_PATHS:
            body = bytearray()
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            if self.refusal is not None:
                self.refused += 1
                return await _json(send, 503, {"error": {"message": f"stub refuses: {self.refusal}",
                                                         "type": self.refusal, "code": 503}})
            if self.failure is not None:
                status, content_type, raw = self.failure
                await send({"type": "http.response.start", "status": status, "headers": [
                    (b"content-type", content_type.encode()), (b"content-length", b"%d" % len(raw))]})
                return await send({"type": "http.response.body", "body": raw})
            return await self._generate(path, bytes(body), dict(scope["headers"]), receive, send)
        if path == "/health":
            return await _json(send, 200, {"status": "ok"})
        if path == "/get_server_info":
            return await _json(send, 200, {
                "role": self.role, "bootstrap_port": self.bootstrap_port if self.role == "prefill" else None,
                "prefill_group": self.prefill_group, "served_model_name": self.model,
                "length_threshold": 256})
        if path == "/stub/requests":
            return await _json(send, 200, list(self.requests))
        if path == "/stub/stats":
            return await _json(send, 200, {"requests": len(self.requests), "disconnects": self.disconnects,
                                           "refused": self.refused})
        if path == "/v1/models":
            return await _json(send, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        return await _json(send, 404, {"error": {"message": f"no route {path}"}})

    async def _generate(self, path: str, raw: bytes, headers: dict[bytes, bytes], receive, send) -> None:
        # Like a real engine, notice a caller that hangs up and stop working for it.
        work = asyncio.ensure_future(self._respond(path, raw, headers, send))
        hangup = asyncio.ensure_future(_until_disconnect(receive))
        await asyncio.wait((work, hangup), return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            self.disconnects += 1
            work.cancel()
        hangup.cancel()
        await asyncio.gather(work, hangup, return_exceptions=True)

    async def _respond(self, path: str, raw: bytes, headers: dict[bytes, bytes], send) -> None:
        try:
            body = json.loads(raw)
            room = body["bootstrap_room"]
        except (ValueError, KeyError, TypeError):
            return await _json(send, 400, {"error": {"message": "need a JSON body with bootstrap_room"}})
        self.requests.append({"path": path, "room": room, "role": self.role,
                              "bootstrap_host": body.get("bootstrap_host"),
                              "bootstrap_port": body.get("bootstrap_port"),
                              "request_id": headers.get(b"x-request-id", b"").decode("latin-1"),
                              # top-level keys as sent, in order, duplicates included
                              "keys": [k for k, _ in json.loads(raw, object_pairs_hook=list)]})
        if self.role == "prefill":
            if self.prefill_delay_s:
                await asyncio.sleep(self.prefill_delay_s)
            if self.prefill_gate is not None:
                await asyncio.to_thread(self.prefill_gate.wait, 60)
            if self.handoff is not None:
                self.handoff.send(room)
            return await _json(send, 200, {"meta_info": {"id": str(room), "prefill": True}})
        n = min(int(_max_tokens(body) or 4), self.max_tokens_cap)
        if self.first_token_delay_s:
            await asyncio.sleep(self.first_token_delay_s)
        if self.handoff is not None and not await self.handoff.receive(room):
            return await _json(send, 504, {"error": {"message": f"no KV arrived for room {room}"}})
        if not body.get("stream"):
            return await _json(send, 200, _answer(path, self.model, ["ok"] * n))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(n):
            event = b"data: " + _chunk(path, self.model, "ok", last=i == n - 1) + b"\n\n"
            if self.split_events:
                half = len(event) // 2
                await send({"type": "http.response.body", "body": event[:half], "more_body": True})
                await asyncio.sleep(self.token_delay_s)
                await send({"type": "http.response.body", "body": event[half:], "more_body": True})
                continue
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": _DONE, "more_body": False})


def _max_tokens(body: dict):
    return (body.get("max_tokens") or body.get("max_completion_tokens")
            or (body.get("sampling_params") or {}).get("max_new_tokens"))


def _answer(path: str, model: str, tokens: list[str]) -> dict:
    text = " ".join(tokens)
    usage = {"prompt_tokens": 1, "completion_tokens": len(tokens), "total_tokens": 1 + len(tokens)}
    if path == "/generate":
        return {"text": text, "meta_info": {"completion_tokens": len(tokens)}}
    if path == "/v1/chat/completions":
        return {"id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()),
                "model": model, "usage": usage, "choices": [{
                    "index": 0, "finish_reason": "length",
                    "message": {"role": "assistant", "content": text}}]}
    return {"id": "cmpl-stub", "object": "text_completion", "created": int(time.time()),
            "model": model, "usage": usage, "choices": [{
                "index": 0, "text": text, "finish_reason": "length", "logprobs": None}]}


def _chunk(path: str, model: str, token: str, last: bool) -> bytes:
    finish = "length" if last else None
    if path == "/generate":
        doc = {"text": token, "meta_info": {"finish_reason": finish}}
    elif path == "/v1/chat/completions":
        doc = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": model,
               "choices": [{"index": 0, "delta": {"content": token + " "}, "finish_reason": finish}]}
    else:
        doc = {"id": "cmpl-stub", "object": "text_completion", "created": 0, "model": model,
               "choices": [{"index": 0, "text": token + " ", "finish_reason": finish, "logprobs": None}]}
    return json.dumps(doc).encode()


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json(send, status: int, doc) -> None:
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stub_engine")
    p.add_argument("--role", choices=("prefill", "decode"), required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--model", default="default")
    p.add_argument("--prefill-delay", type=float, default=0.0)
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--first-token-delay", type=float, default=0.0)
    args = p.parse_args(argv)
    from laps_agent.serving.listen import bind_listening_socket, run_forever  # noqa: I001

    sock = bind_listening_socket(args.host, args.port)
    print(f"LISTENING {sock.getsockname()[1]}", flush=True)
    run_forever(StubEngine(args.role, model=args.model, prefill_delay_s=args.prefill_delay,
                           token_delay_s=args.token_delay,
                           first_token_delay_s=args.first_token_delay), sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
