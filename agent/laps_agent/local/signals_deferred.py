"""Ctrl-C held off while child processes are forked (`laps local`'s engines, `laps bench
compare`'s stacks)."""
from __future__ import annotations

import signal


class SignalsDeferred:
    """SIGINT and SIGTERM held off inside the block, then a KeyboardInterrupt on the way out if
    one came. As KeyboardInterrupt inside Popen, a Ctrl-C was lost: with a preexec_fn, a fork
    hook (logging's) swallows it with "Exception ignored", and `laps local` went on to serve;
    or the child was forked but its Popen never returned, so nothing stopped it."""

    def __enter__(self) -> SignalsDeferred:
        self.pending: list[int] = []
        self._previous = {sig: signal.signal(sig, lambda signum, frame: self.pending.append(signum))
                          for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self.pending and exc_type is None:
            raise KeyboardInterrupt
