"""What goes into and comes out of an `EngineModel` (core.py): requests and client-visible events.

Separate from the model so that its drivers (the emulated engine, `laps sim`) and their tests read
as plain records, apart from the state machine that consumes and produces them.

Events report what clients see: a request's tokens ("token", `tokens` = completion tokens so
far; the first one is its time to first token), the end of a prefill-only request ("prefilled":
its KV is ready to hand off) and refusals ("error").
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("generate", "prefill", "decode")


@dataclass(slots=True)
class ModelRequest:
    rid: str
    kind: str                 # "generate" (prefill + decode here) | "prefill" | "decode" (KV arrived)
    prompt_tokens: int
    max_new_tokens: int
    arrival: float            # the caller's clock (decode: when its request reached the engine)
    cached_tokens: int = 0
    cls: str = ""
    pages: int = 0            # KV pages held
    outputs: int = 0          # completion tokens this request will produce here in all
    start_step: int = 0       # decode steps done by the engine when it joined the running set
    blocks: Sequence[int] | None = None   # the prompt's KV-page keys, for the prefix cache
    gateway_cls: str | None = None        # the class the gateway sent (X-LAPS-Class), for metrics
    due: float = 0.0          # decode: when its first token is due (DecodeOrder.deadline)


@dataclass(slots=True)
class Event:
    rid: str
    kind: str                 # "token" | "prefilled" | "error"
    time: float
    tokens: int = 0           # completion tokens so far
    finished: bool = False
    error: str | None = None
    cls: str = ""
