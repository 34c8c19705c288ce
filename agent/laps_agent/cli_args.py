"""Argument types the CLIs share (engine, benchmarks): values that cannot describe a run (0
clients, a 0 KiB body, a NaN timeout, a graph of batch size 0) are refused by argparse with the
flag's name, not met mid-run."""
from __future__ import annotations

import argparse
from typing import Callable, TypeVar

Number = TypeVar("Number", int, float)


def positive(kind: Callable[[str], Number]) -> Callable[[str], Number]:
    def parse(text: str) -> Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:  # also refuses NaN
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def positive_ints(text: str) -> list[int]:
    """Comma-separated integers, each >= 1."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def slo_seconds(text: str) -> dict[str, float]:
    """Per-class TTFT SLOs `short=S,long=S` (and `all=S`, for a class without its own), seconds
    > 0: what `laps bench run|compare` and `laps sim` take as --slo."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in ("short", "long", "all"):
            raise argparse.ArgumentTypeError(f"expected short=S,long=S (seconds), got {text!r}")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
        if not out[name.strip()] > 0:  # also refuses NaN
            raise argparse.ArgumentTypeError(f"SLO must be > 0 seconds: {part!r}")
    return out
