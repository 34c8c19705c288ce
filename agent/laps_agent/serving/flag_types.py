"""Argument types the CLIs share (engine, benchmarks, simulator): values that cannot describe a
run (0 clients, a 0 KiB body, a NaN timeout, an infinite rate, a graph of batch size 0, a result
directory that is a file) are refused by argparse with the flag's name, not met mid-run or, for
the output paths, after the run, when its measurements would be lost."""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path
from typing import Callable, Mapping, TypeVar

Number = TypeVar("Number", int, float)


def _bounded(kind: Callable[[str], Number], text: str, ok: Callable[[Number], bool], rule: str,
             finite: bool) -> Number:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not ok(value):  # comparisons with NaN are false: refused here
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
    if finite and not math.isfinite(value):  # `inf` as a rate, a count or a duration ends in
        # an OverflowError or a run that never ends
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive(kind: Callable[[str], Number], *, finite: bool = True) -> Callable[[str], Number]:
    """> 0. `finite=False` where infinity means something (a timeout that never fires)."""
    return lambda text: _bounded(kind, text, lambda v: v > 0, "> 0", finite)


def at_least(kind: Callable[[str], Number], low: Number) -> Callable[[str], Number]:
    """>= low, finite."""
    return lambda text: _bounded(kind, text, lambda v: v >= low, f">= {low:g}", True)


def non_negative(kind: Callable[[str], Number]) -> Callable[[str], Number]:
    return at_least(kind, kind("0"))


def positive_ints(text: str) -> list[int]:
    """Comma-separated integers, each >= 1."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def names(text: str) -> list[str]:
    """Comma-separated names, at least one (`--systems ''` used to run nothing and exit 0)."""
    out = [name.strip() for name in text.split(",") if name.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return out


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


def slo_text(slos: Mapping[str, float]) -> str:
    """The --slo flag's text for per-class SLOs in seconds: what slo_seconds reads back exactly
    (repr of the float), so every writer of the flag (laps bench, the operator) passes the same
    values as the caller holds."""
    return ",".join(f"{cls}={float(seconds)!r}" for cls, seconds in slos.items())


def unwritable_dir(path: Path) -> str | None:
    """Why `path` cannot be (or become) a directory this process writes into; None if it can.
    Nothing is left behind (a trial directory is made and removed at once): a run refused later
    for another reason leaves no empty directory."""
    if path.exists():
        return None if path.is_dir() and os.access(path, os.W_OK | os.X_OK) else (
            "exists and is not a directory" if not path.is_dir() else "is not writable")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create it in {parent} (not writable)"
    # Permissions are not the whole story (/proc and /sys refuse any new entry, even to root):
    # a directory made and removed at once says it, before a run whose results it would lose.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".laps-", dir=parent))
    except OSError as exc:
        return f"cannot create it in {parent} ({exc.strerror or exc})"
    return None


def output_dir(text: str) -> Path:
    """A result directory that exists or can be created."""
    problem = unwritable_dir(Path(text))
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return Path(text)


def output_file(text: str) -> Path:
    """A file to write in an existing, writable directory."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: {parent} is not writable")
    return path


def flag_given(flag: str, argv: list[str]) -> bool:
    """Whether `flag` is on the command line (`--flag V` or `--flag=V`): a default and a value
    the user gave that equals it differ."""
    return any(a == flag or a.startswith(flag + "=") for a in argv)
