"""Which request takes a free decode slot (pure; the decode role of the builtin and emulated
engines, `laps sim`'s, and the SGLang plugin's on a decode server).

Requests whose KV has arrived wait for a decode slot (and its KV pages). A LAPS decode engine
gives the next one to the request whose first token is due first: its deadline is when the engine
received it plus its class's TTFT SLO (`--slo`, the gateway's and the CR's slo.ttftP90Seconds;
the class by its whole prompt, as the client's SLO counts it). Those that can still meet their
deadline go first, earliest first; those already past it go after them, earliest first: taking a
slot from a request still in time makes it late as well, and buys the late one nothing it can
still meet. A decode engine without the LAPS scheduler (`--no-laps-scheduler`, vanilla PD) or
with `--decode-order fifo` (the reference LAPS) admits in arrival order, as stock SGLang's decode
server does without our plugin; with it, the plugin orders a decode server's waiting queue the
same way (sglang_plugin/hooks.py).

Why: when decode is the bottleneck, short prompts (a 0.5 s SLO) queued behind long ones (3 s)
missed while the long ones had seconds to spare. What it changed on the workload matrices, and
what it does not protect against (a flood of long answers holding every slot: the gateway's
decode share, admission.py rule 3): docs/design/scheduler.md, "Decode admission"."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from laps_agent.policy.classes import length_class
from laps_agent.policy.slo import ttft_slos

T = TypeVar("T")
# The engines' --decode-order: by deadline (this module), or in arrival order (stock SGLang's).
DECODE_ORDERS = ("deadline", "fifo")


@dataclass(frozen=True)
class DecodeOrder:
    """Deadline order: each class's TTFT SLO (seconds) and the length threshold that classes."""
    ttft_slo_s: Mapping[str, float]
    length_threshold: int

    @classmethod
    def from_slo(cls, given: Mapping[str, float] | None, length_threshold: int) -> DecodeOrder:
        """From `short=`/`long=`/`all=` values as the --slo flag gives them (None: the defaults)."""
        return cls(ttft_slos(given), length_threshold)

    def deadline(self, received_at: float, prompt_tokens: int) -> float:
        """When the first token of a request of `prompt_tokens`, received at `received_at`, is due."""
        return received_at + self.ttft_slo_s[length_class(prompt_tokens, self.length_threshold)]


def chosen_order(laps_scheduler: bool, rule: str, given_slo: Mapping[str, float] | None,
                 length_threshold: int) -> DecodeOrder | None:
    """The order a decode engine runs (None: arrival order): by deadline with the LAPS scheduler
    and the rule "deadline" (`--decode-order`, LAPS_DECODE_ORDER); `given_slo` as --slo gives it."""
    if not laps_scheduler or rule != "deadline":
        return None
    return DecodeOrder.from_slo(given_slo, length_threshold)


def admission_key(deadline: float, now: float) -> tuple[bool, float]:
    """A waiting request's place at `now` (smaller first): still in time before late, then by
    deadline."""
    return deadline < now, deadline


def next_admitted(waiting: Iterable[T], deadline: Callable[[T], float], now: float) -> T | None:
    """The waiting request that takes the next free slot at `now` (the module docstring's order;
    the first of equals, so equal deadlines keep arrival order); None when none waits."""
    return min(waiting, key=lambda w: admission_key(deadline(w), now), default=None)


def admission_order(waiting: Iterable[T], deadline: Callable[[T], float], now: float) -> list[T]:
    """All of `waiting` in the order they take free slots at `now` (stable: equals keep their
    order): what a driver that hands its engine a whole queue (the SGLang plugin) sorts by."""
    return sorted(waiting, key=lambda w: admission_key(deadline(w), now))
