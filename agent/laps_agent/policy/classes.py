"""The one rule of what is short: a request whose prefill work is at most the length threshold.

Every component asks this module: the engines' dual queue (by uncached tokens), the gateway's
routing (by its estimate), the emulated engine, the simulator and the benchmark reports. Changing
the rule here (e.g. to a strict `<`) changes it everywhere at once.
"""
from __future__ import annotations

from typing import TypeVar

SHORT, LONG = "short", "long"
CLASSES = (SHORT, LONG)
DEFAULT_LENGTH_THRESHOLD = 256

_N = TypeVar("_N")


def is_short(tokens: _N, threshold: int) -> _N:
    """True where `tokens` (an int, or a numpy array of them) is short under `threshold`."""
    return tokens <= threshold


def length_class(tokens: int, threshold: int) -> str:
    """"short" | "long" for `tokens` prompt tokens that need prefill."""
    return SHORT if is_short(tokens, threshold) else LONG
