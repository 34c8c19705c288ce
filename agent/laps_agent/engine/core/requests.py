"""What flows between the HTTP side and the engine thread: submitted work and its outputs."""
from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from laps_agent.engine.core.sampling_params import SamplingParams

_counter = itertools.count()


def new_rid() -> str:
    return f"{uuid.uuid4().hex[:12]}-{next(_counter)}"


@dataclass
class GenerateWork:
    """One request handed to the engine.

    kind: "generate" (prefill + decode here), "prefill" (prefill here, hand off the KV: the
    `prefill` PD role), "decode" (KV + first token came from a prefill engine: the `decode` role),
    "warm" (compute into the prefix cache at the lowest priority, no output: prefix_warm.py).
    """

    rid: str
    input_ids: list[int]
    params: SamplingParams
    kind: str = "generate"
    arrival: float = field(default_factory=time.monotonic)
    # Decode: when its request reached the engine, before the KV fetch (time.monotonic); its first
    # token's deadline counts from here (decode_order.py). None: `arrival`.
    received: float | None = None

    @property
    def received_at(self) -> float:
        """When the request reached the engine: `received` where the server set it, else `arrival`."""
        return self.arrival if self.received is None else self.received
    kv: Any = None                 # decode: CPU tensor [layers, 2, len(input_ids), kv_heads, head_dim]
    first_token: int | None = None  # decode: the token the prefill engine sampled
    gateway_cls: str | None = None  # the class the gateway chose (X-LAPS-Class header), for metrics
    cached_tokens: int = 0          # decode: prompt tokens the prefill engine's prefix cache held
    warm_to: tuple[str, int] | None = None  # decode: the prefill engine's bootstrap address to warm
    # The client's X-Request-ID (laps_agent/serving/request_id.py), named by the failure log lines of the
    # engine and its server; "-" for work no client sent (warms, the health probe).
    request_id: str = "-"


@dataclass
class EngineOutput:
    """A step's news for one request; `finished` outputs are the last ones for that rid."""

    rid: str
    token_ids: list[int] = field(default_factory=list)   # new tokens this step
    text: str = ""                                        # newly releasable text
    finished: bool = False
    finish_reason: str | None = None                      # "stop" | "length" | "abort" | "error"
    matched_stop: str | int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0                                # prompt tokens served by the prefix cache
    error: str | None = None
    error_status: int = 500
    kv: Any = None                                        # prefill role: exported prompt KV
    ttft_s: float | None = None
    cls: str | None = None                                # "short" | "long" (scheduler class)


OutputSink = Callable[[EngineOutput], None]
