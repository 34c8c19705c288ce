"""A `laps` subcommand (for tests/integration/engine/test_exit_reason.py) that fails as a real
one can where nothing catches it."""
from __future__ import annotations


def main(argv: list[str]) -> int:
    raise RuntimeError("CUDA error: out of memory")
