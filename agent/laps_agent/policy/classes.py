"""The one rule of what is short: a request whose prefill work is at most the length threshold.

Every component asks this module: the engines' dual queue (by uncached tokens), the gateway's
routing (by its estimate), the emulated engine, the simulator and the benchmark reports. Changing
the rule here (e.g. to a strict `<`) changes it everywhere at once.
"""
from __future__ import annotations

from enum import StrEnum
from typing import TypeVar


class LengthClass(StrEnum):
    """The two length classes, which name the prefill groups too. Members are strings
    (LengthClass.SHORT == "short"), so labels, JSON and metrics carry the plain values."""
    SHORT = "short"
    LONG = "long"


SHORT, LONG = LengthClass.SHORT, LengthClass.LONG
# A tuple, not the enum class: `x in CLASSES` must answer for any value (None, a label someone
# wrote by hand), which `x in LengthClass` does not for non-members on Python 3.11.
CLASSES: tuple[LengthClass, ...] = (SHORT, LONG)
OTHER: dict[str, LengthClass] = {SHORT: LONG, LONG: SHORT}   # the other class (group)
DEFAULT_LENGTH_THRESHOLD = 256

_N = TypeVar("_N")


def is_short(tokens: _N, threshold: int) -> _N:
    """True where `tokens` (an int, or a numpy array of them) is short under `threshold`."""
    return tokens <= threshold


def length_class(tokens: int, threshold: int) -> LengthClass:
    """"short" | "long" for `tokens` prompt tokens that need prefill."""
    return SHORT if is_short(tokens, threshold) else LONG
