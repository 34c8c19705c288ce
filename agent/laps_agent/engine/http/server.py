"""HTTP front of one engine: SGLang-native /generate, OpenAI /v1/*, health, info, metrics, and the
PD hand-off (prefill role parks KV in its outbox; decode role fetches it before decoding). The
routes are in routes.py (which builds the app over a server, importing nothing of it), the JSON
and SSE bodies sent back in responses.py.

Torch-free: it serves the builtin engine (with `pd.kv_codec.TensorKVCodec`) and the emulated
engine (with its own codec) alike; its builder gives it the codec. What it needs of an engine:
`ServedEngine` below.

Drain (laps_agent/serving/drain.py): after SIGTERM the engine answers new work 503 `draining` and /health
503, and keeps serving what it holds, the KV hand-offs of its prefills included (the bootstrap
server outlives the drain). Queue bound: a request arriving while `max_queued_requests` wait in
this engine gets 503 `queue_full` (the gateway retries it on another pod)."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from laps_agent.engine.core.config import EngineConfig
from laps_agent.engine.core.load_report import LAPS_CLASS_HEADER
from laps_agent.engine.core.requests import EngineOutput, GenerateWork, OutputSink, new_rid
from laps_agent.engine.http import api_models as api
from laps_agent.engine.http.responses import final_body, sse_events
from laps_agent.engine.http.routes import build_app
from laps_agent.engine.http.util import ClientGone, failed, read_json, until_disconnect, until_stream_end
from laps_agent.engine.metrics import EngineMetrics
from laps_agent.engine.pd.prefix_warm import parse_warm_body, send_warm
from laps_agent.engine.pd.wire import BootstrapError, KVCodec, KVOutbox, fetch_payload
from laps_agent.modelio.prompt_rules import CONTEXT_LENGTH_EXCEEDED, over_context_message
from laps_agent.serving.drain import DEFAULT_GRACE_S, Drain
from laps_agent.serving.request_body import BODY_IDLE_TIMEOUT_S
from laps_agent.serving.request_id import shown

log = logging.getLogger(__name__)
MIN_QUEUE_BOUND = 256
TOKENIZE_INLINE_MAX = 262144  # chars tokenized on the loop; longer: a thread (the hop cost 2 ms at 40 KiB)


class ServedEngine(Protocol):
    """What the server needs of an engine: the builtin one (engine.py's Engine) and the emulated
    one (emulated/engine.py's EmulatedEngine) both are one. `submit` and `abort` are called from
    the event loop; `kv` has `num_pages` and `page_size`."""

    tokenizer: Any
    config: EngineConfig
    grid: Any
    kv: Any
    snapshot: dict[str, Any]

    @property
    def alive(self) -> bool: ...

    def submit(self, work: GenerateWork, sink: OutputSink) -> None: ...

    def abort(self, rid: str) -> None: ...

    def max_prompt_tokens(self) -> int: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = ...) -> None: ...


@dataclass(frozen=True)
class ServerSettings:
    role: str
    served_model_name: str
    length_threshold: int
    bootstrap_port: int | None = None
    bootstrap_timeout_s: float = 30.0
    labels_file: str | None = None
    backend: str = "builtin"
    profile: str | None = None          # emulated backend: the profile's name
    drain_grace_s: float = DEFAULT_GRACE_S
    max_queued_requests: int = MIN_QUEUE_BOUND  # 0: no bound (`laps engine`: see queue_bound)
    prefix_warm: bool = False           # prefix_warm.py: decode sends answers back, prefill takes them
    body_idle_timeout_s: float = BODY_IDLE_TIMEOUT_S   # a stalled request body: 408 (request_body.py)


def queue_bound(flag: int | None, max_running: int) -> int:
    """--max-queued-requests, defaulting to four times what runs at once (at least
    MIN_QUEUE_BOUND): deeper, a request would wait longer than any client does, while another
    pod may have room."""
    return max(MIN_QUEUE_BOUND, 4 * max_running) if flag is None else max(flag, 0)


class EngineServer:
    def __init__(self, engine: ServedEngine, settings: ServerSettings, metrics: EngineMetrics,
                 codec: KVCodec) -> None:
        self.engine, self.settings, self.metrics = engine, settings, metrics
        self.codec = codec
        self.tokenizer = engine.tokenizer
        self.outbox = KVOutbox(settings.bootstrap_timeout_s)
        self.fetching = 0  # decode role: requests waiting for their KV from a prefill engine
        self.queued = 0    # submitted to the engine, no output yet (waiting for prefill or a slot)
        self.drain = Drain(settings.drain_grace_s)
        self._warm_tasks: set[asyncio.Task] = set()  # decode role: warms on their way (referenced)
        self.app = build_app(self)

    async def aclose(self) -> None:
        """Nothing to close: each KV fetch opens and closes its own connection (pd_fetch)."""

    # ---- request plumbing ------------------------------------------------------------------
    async def tokenize(self, parsed: api.ParsedRequest) -> list[int]:
        """A long prompt is tokenized on a worker thread, GIL released: on the event loop, a few MB
        of text froze /health, /get_load and every stream here for seconds."""
        size = len(parsed.text or "") if parsed.input_ids is None else len(parsed.input_ids)
        if size > TOKENIZE_INLINE_MAX:
            return await asyncio.to_thread(self._tokenize, parsed, self.tokenizer.encode_unlocked)
        return self._tokenize(parsed, self.tokenizer.encode)

    def _tokenize(self, parsed: api.ParsedRequest, encode) -> list[int]:
        if parsed.input_ids is not None:
            ids = parsed.input_ids
        else:
            try:
                ids = encode(parsed.text or "", add_special_tokens=parsed.add_special_tokens)
            except (TypeError, ValueError) as exc:  # text it cannot encode is the client's error
                raise api.ApiError(400, f"the tokenizer cannot encode the prompt: {exc}") from None
        if not ids:
            raise api.ApiError(400, "the prompt is empty")
        limit = self.engine.max_prompt_tokens()
        if len(ids) > limit:  # no room left for even one new token: refused up front, as SGLang
            raise api.ApiError(400, over_context_message(len(ids), limit), CONTEXT_LENGTH_EXCEEDED)
        vocab = self.tokenizer.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise api.ApiError(400, f"input_ids must be in [0, {vocab})")
        return ids

    async def outputs(self, work: GenerateWork) -> AsyncIterator[EngineOutput]:
        """Submit and yield outputs until the finished one; aborts the request if the consumer
        stops early (client gone, cancellation)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
        self.engine.submit(work, lambda out: loop.call_soon_threadsafe(queue.put_nowait, out))
        self.queued += 1
        waiting, finished = True, False
        answer: list[int] | None = [] if work.warm_to is not None else None
        try:
            while not finished:
                out = await queue.get()
                if waiting:
                    waiting = False
                    self.queued -= 1
                finished = out.finished
                if answer is not None:
                    answer += out.token_ids
                    if finished and out.finish_reason in ("stop", "length"):
                        self._warm(work, answer)
                yield out
        finally:
            if waiting:
                self.queued -= 1
            if not finished:
                self.engine.abort(work.rid)

    # ---- prefix warming (prefix_warm.py) -----------------------------------------------------
    def _warm(self, work: GenerateWork, answer: list[int]) -> None:
        """Decode role: send the finished prompt + answer to the prefill engine that served it."""
        host, port = work.warm_to
        task = asyncio.ensure_future(send_warm(host, port, list(work.input_ids) + answer))
        self._warm_tasks.add(task)
        task.add_done_callback(self._warm_tasks.discard)

    def warm_handler(self) -> Callable[[bytes], tuple[int, str]] | None:
        """Prefill role with --prefix-warm: what the bootstrap port calls with a warm's body,
        returning (status, message); None where this engine takes no warms."""
        if self.settings.role != "prefill" or not self.settings.prefix_warm:
            return None

        def accept(raw: bytes) -> tuple[int, str]:
            try:
                ids = parse_warm_body(raw, self.tokenizer.vocab_size, self.engine.max_prompt_tokens())
            except ValueError as exc:
                return 400, str(exc)
            self.engine.submit(GenerateWork(new_rid(), ids, None, kind="warm"), _no_output)
            return 202, "queued"

        return accept

    def check_queue(self) -> None:
        """503 `queue_full` when this engine already holds its bound of waiting requests (a
        decode engine's requests still fetching their KV count: they queue here next)."""
        bound = self.settings.max_queued_requests
        waiting = self.queued + self.fetching
        if bound and waiting >= bound:
            raise api.ApiError(503, f"engine queue full ({waiting} waiting, bound {bound}); retry "
                                    f"later or on another engine", "queue_full", retry_after=1)

    async def prepare(self, parsed: api.ParsedRequest, request: Request) -> tuple[GenerateWork, dict]:
        """Tokenize and, for the decode role, collect the KV from the prefill engine first."""
        received = time.monotonic()   # a decode request's first token is due from here (decode_order.py)
        ids = await self.tokenize(parsed)
        rid = parsed.rid or new_rid()
        role, boot = self.settings.role, parsed.bootstrap
        # Per request, whatever its kind: the class for metrics, the client's id for failure logs.
        tags = {"gateway_cls": api.gateway_class(request.headers.get(LAPS_CLASS_HEADER)),
                "request_id": shown(request.scope)}
        extra: dict[str, Any] = {}
        if role == "decode":
            if boot is None:
                raise api.ApiError(400, "this is a decode engine: requests need bootstrap_host, "
                                        "bootstrap_port and bootstrap_room")
            self.fetching += 1
            try:
                payload = await until_disconnect(request, fetch_payload(
                    boot.host, boot.port, boot.room, self.settings.bootstrap_timeout_s))
            finally:
                self.fetching -= 1
            transfer = await self.codec.decode(payload)
            if transfer.room != boot.room:
                raise BootstrapError(f"asked for room {boot.room}, got {transfer.room}")
            if transfer.input_ids != ids:
                raise api.ApiError(502, "prefill and decode engines tokenized the prompt differently",
                                   "bootstrap_error")
            extra["bootstrap_room"] = boot.room
            cached = (getattr(transfer, "meta", None) or {}).get("cached_tokens")
            return GenerateWork(rid, ids, parsed.params, kind="decode", kv=transfer.kv,
                                first_token=transfer.first_token, received=received, **tags,
                                cached_tokens=cached if isinstance(cached, int) else 0,
                                warm_to=(boot.host, boot.port) if self.settings.prefix_warm else None), extra
        if role == "prefill" and boot is not None:
            # From here the bootstrap port answers this room's decode engine (and only then:
            # pd_wire.py hands out KV for rooms a request being served here announced).
            self.outbox.announce(boot.room)
            extra["bootstrap_room"] = boot.room
            return GenerateWork(rid, ids, parsed.params, kind="prefill", **tags), extra
        return GenerateWork(rid, ids, parsed.params, **tags), extra

    async def hand_off(self, out: EngineOutput, boot: api.Bootstrap, input_ids: list[int]) -> None:
        """Park the prefilled KV for the decode engine and wait until it is collected."""
        # The decode engine answers the client, so it reports the prefix cache hit made here.
        meta = {"cached_tokens": out.cached_tokens} if out.cached_tokens else None
        args = (boot.room, list(input_ids), out.token_ids[0], out.kv)
        payload = await (self.codec.encode(*args, meta=meta) if meta else self.codec.encode(*args))
        out.kv = None
        await self.outbox.hand_off(boot.room, payload)

    async def collect(self, work: GenerateWork, boot: api.Bootstrap | None) -> tuple[list[EngineOutput], EngineOutput]:
        outs: list[EngineOutput] = []
        async for out in self.outputs(work):
            outs.append(out)
        last = outs[-1]
        if last.error:
            raise api.ApiError(last.error_status, last.error, "engine_error")
        if work.kind == "prefill" and boot is not None:
            await self.hand_off(last, boot, work.input_ids)
        return outs, last

    # ---- endpoints -------------------------------------------------------------------------
    async def serve(self, request: Request, kind: str) -> Response:
        started = time.monotonic()
        try:
            body = await read_json(request, self.settings.body_idle_timeout_s)
            if kind == "generate":
                parsed = api.parse_generate(body)
            elif kind == "completion":
                parsed = api.parse_completion(body)
            else:
                parsed = api.parse_chat(body, self.tokenizer.apply_chat_template)
            self.check_queue()
            work, extra = await self.prepare(parsed, request)
            if parsed.stream:
                first = await self._first_output(work, parsed, request)
                events = sse_events(work, parsed, first, extra, started, self.settings.served_model_name)
                return StreamingResponse(until_stream_end(events, self.metrics.client_disconnects.inc),
                                         media_type="text/event-stream")
            outs, last = await until_disconnect(request, self.collect(work, parsed.bootstrap))
        except api.ApiError as exc:
            return failed(request, exc)
        except BootstrapError as exc:
            # On a decode engine: its KV never came from the prefill engine (the prefill side is
            # overloaded or gone; the gateway blames the prefill pod for it). On a prefill
            # engine: no decode engine collected the KV. docs/contracts.md, engine errors.
            return failed(request, api.ApiError(504, str(exc), "bootstrap_error"))
        except ClientGone:
            self.metrics.client_disconnects.inc()
            log.debug("request %s: the client went away", shown(request.scope))
            return Response(status_code=499)
        return JSONResponse(final_body(work, parsed, outs, last, extra, started,
                                       self.settings.served_model_name))

    async def _first_output(self, work: GenerateWork, parsed: api.ParsedRequest, request: Request):
        """Streaming: run until the first output before sending headers, so failures that happen
        up front (bootstrap, bad prompt) still get a proper status code."""
        gen = self.outputs(work)
        try:
            first = await until_disconnect(request, gen.__anext__())
        except BaseException:
            await gen.aclose()
            raise
        if first.error:
            await gen.aclose()
            raise api.ApiError(first.error_status, first.error, "engine_error")
        if work.kind == "prefill" and parsed.bootstrap is not None:
            try:
                await until_disconnect(request, self.hand_off(first, parsed.bootstrap, work.input_ids))
            finally:
                await gen.aclose()
        return first, gen


def _no_output(out: EngineOutput) -> None:
    """A warm answers nothing (the engine reports it through on_warm)."""
