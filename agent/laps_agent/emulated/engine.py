"""The emulated engine: the builtin engine's HTTP server and PD protocol, with an `EngineModel`
in place of the model, driven by the wall clock on the server's own event loop (why the model is
not the builtin engine's EngineCore: core.py).

It computes nothing and sleeps instead, so many of them share a small machine. Phases are laid
end to end on the model's own timeline (a phase starts when the previous one *should* have
ended), so the event loop's wake-up latency delays what clients see by that latency but never
accumulates into the engine's throughput.

Output text is synthetic (a fixed rotation of single-token words of the tokenizer) but token
counts are honoured: every request produces exactly its max_new_tokens (capped by the context,
as the builtin engine caps it); stop strings and EOS are not emulated.
"""
from __future__ import annotations

import asyncio
import logging
import time
import zlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from laps_agent.emulated.core import EngineModel
from laps_agent.emulated.profile import Profile
from laps_agent.emulated.requests import Event, ModelRequest
from laps_agent.engine.core.config import EngineConfig
from laps_agent.engine.core.requests import EngineOutput, GenerateWork, OutputSink
from laps_agent.engine.pd.wire import BootstrapError, decode_frame, encode_frame

log = logging.getLogger(__name__)
FILLER_WORDS = (" the", " of", " and", " to", " in", " data", " model", " time", " value", " system")


def synthetic_vocabulary(tokenizer: Any) -> list[tuple[int, str]]:
    """(token id, text) pairs of common words that are one token each in this tokenizer."""
    vocab = []
    for word in FILLER_WORDS:
        ids = tokenizer.encode(word)
        if len(ids) == 1:
            vocab.append((ids[0], tokenizer.decode(ids)))
    return vocab or [(0, " ")]


@dataclass
class EmulatedTransfer:
    room: int
    input_ids: list[int]
    first_token: int
    kv: Any = None
    meta: dict = field(default_factory=dict)


def page_keys(input_ids: list[int], page_size: int) -> list[int]:
    """One key per whole KV page of a prompt, chained (a key stands for all tokens up to the end
    of its page), as the prefix cache model wants them."""
    keys, key = [], 0
    for start in range(0, len(input_ids) - page_size + 1, page_size):
        key = hash((key, tuple(input_ids[start:start + page_size])))
        keys.append(key)
    return keys


class EmulatedKVCodec:
    """The hand-off of an emulated prefill engine: the wire and the protocol are the builtin
    engine's, the payload is a header only, and the modelled transfer time of the prompt's KV
    (profile.transfer_seconds) passes before the payload is offered to the decode engine."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    async def encode(self, room: int, input_ids: list[int], first_token: int, kv: Any,
                     meta: dict | None = None) -> bytes:
        await asyncio.sleep(self.profile.transfer_seconds(len(input_ids)))
        return encode_frame({"room": room, "input_ids": input_ids, "first_token": first_token,
                             "emulated": True, "kv_bytes": len(input_ids) * self.profile.model.kv_bytes_per_token,
                             "meta": meta or {}})

    async def decode(self, payload: bytes) -> EmulatedTransfer:
        header, _ = decode_frame(payload)
        try:
            return EmulatedTransfer(int(header["room"]), [int(t) for t in header["input_ids"]],
                                    int(header["first_token"]),
                                    meta={**(header.get("meta") or {}), "kv_bytes": header.get("kv_bytes")})
        except (KeyError, TypeError, ValueError) as exc:
            raise BootstrapError(f"corrupt KV transfer payload: {exc}") from None


class EmulatedEngine:
    """What `EngineServer` needs of an engine, over an EngineModel. Lives on one event loop: the
    driver task starts with the first request."""

    def __init__(self, model: EngineModel, tokenizer: Any, config: EngineConfig, *,
                 on_first_token: Callable[[str, float], None] | None = None) -> None:
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.grid = model.grid
        self.kv = SimpleNamespace(num_pages=model.num_pages, page_size=model.page_size)
        self.on_first_token = on_first_token
        self.snapshot: dict[str, Any] = model.snapshot()
        self._vocab = synthetic_vocabulary(tokenizer)
        # rid -> (work, sink, the model's request: it carries the cached tokens the model found)
        self._live: dict[str, tuple[GenerateWork, OutputSink, ModelRequest]] = {}
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False

    # ---- the engine interface ----------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not self._stopped and (self._task is None or not self._task.done())

    def max_prompt_tokens(self) -> int:
        return self.model.max_prompt_tokens()

    def start(self) -> None:
        """Nothing to start ahead: the driver runs on the server's loop from the first request."""

    def stop(self, timeout: float = 0.0) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()

    def submit(self, work: GenerateWork, sink: OutputSink) -> None:
        self._ensure_running()
        if work.kind == "warm":  # no output: the model reports it through on_warm
            self.model.warm(page_keys(work.input_ids, self.model.page_size), len(work.input_ids))
            self._wake.set()
            return
        req = ModelRequest(work.rid, work.kind, len(work.input_ids), work.params.max_new_tokens,
                           work.received_at, gateway_cls=work.gateway_cls)
        if work.kind == "decode":
            req.cls = ""  # the model classifies it like the prefill engine did
        elif self.model.prefix_cache is not None:
            req.blocks = page_keys(work.input_ids, self.model.page_size)
        self._live[work.rid] = (work, sink, req)
        self._dispatch(self.model.add(req, time.monotonic()))
        self._wake.set()

    def abort(self, rid: str) -> None:
        if self._live.pop(rid, None) is not None:
            self.model.abort(rid)
            if self._wake is not None:
                self._wake.set()

    # ---- the driver --------------------------------------------------------------------------
    def _ensure_running(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="emulated-engine")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._stopped:
                self._wake.clear()
                self._dispatch(self.model.poll(time.monotonic()))
                self.snapshot = self.model.snapshot()
                due = self.model.next_time()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if due is not None:
                    # asyncio's clock is time.monotonic(), the model's clock here.
                    self._timer = loop.call_at(max(due, loop.time()), self._wake.set)
                await self._wake.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must fail requests, not hang them
            log.exception("emulated engine loop failed")
            for rid in list(self._live):
                self._fail(rid, f"internal engine error: {exc}")
            self._stopped = True

    def _dispatch(self, events: list[Event]) -> None:
        for ev in events:
            entry = self._live.get(ev.rid)
            if entry is None:
                continue
            work, sink, req = entry
            if ev.finished:
                del self._live[ev.rid]
            if ev.kind == "error":
                self._emit(work, sink, EngineOutput(ev.rid, finished=True, finish_reason="error", error=ev.error,
                                                    error_status=400))
                continue
            out = self._output(work, ev)
            out.cached_tokens = work.cached_tokens if work.kind == "decode" else req.cached_tokens
            if ev.tokens == 1:
                out.ttft_s = ev.time - work.arrival
                if self.on_first_token is not None:
                    self.on_first_token(ev.cls, out.ttft_s)
            self._emit(work, sink, out)

    def _output(self, work: GenerateWork, ev: Event) -> EngineOutput:
        if ev.tokens == 1 and work.first_token is not None:
            token = work.first_token  # decode role: the prefill engine's token comes first
        else:
            token, _ = self._vocab[(zlib.crc32(work.rid.encode()) + ev.tokens) % len(self._vocab)]
        text = next((t for i, t in self._vocab if i == token), "")
        out = EngineOutput(ev.rid, token_ids=[token], text=text, finished=ev.finished,
                           prompt_tokens=len(work.input_ids), completion_tokens=ev.tokens, cls=ev.cls)
        if ev.kind == "prefilled":
            out.finish_reason = "prefilled"
        elif ev.finished:
            out.finish_reason = "length"
        return out

    def _fail(self, rid: str, message: str) -> None:
        work, sink, _ = self._live.pop(rid)
        self.model.abort(rid)
        self._emit(work, sink, EngineOutput(rid, finished=True, finish_reason="error", error=message))

    @staticmethod
    def _emit(work: GenerateWork, sink: OutputSink, out: EngineOutput) -> None:
        try:
            sink(out)
        except Exception:  # noqa: BLE001 - a broken consumer must not stop the loop
            # The client's id, which the gateway logs too; the rid is only this engine's.
            log.exception("request %s: output sink failed (engine rid %s)", work.request_id, out.rid)
