"""Per-cluster background loops (the resync, the allocation and the status loop), as plain
threads.

Not kopf timers or daemons: kopf puts a finalizer on every object that has one, and a finalizer
makes deleting a LAPSCluster hang whenever the operator is not running (the owner references
already let the garbage collector remove the children; nothing needs to run at deletion). The
cluster watch (an `on.event` handler, which needs no finalizer) starts a cluster's loops when it
sees the cluster and stops them when it is deleted.

A `Ticker` calls its function when due; the function returns the seconds until it is due again
(None: stop). `wake()` makes it run at once, which is how a spec change reaches a loop that is
sleeping through a long interval. Threads are started in a copy of the caller's context, so
`kopf.event` works from them as from a handler.
"""
from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
ERROR_DELAY_S = 5.0
MAX_WAIT_S = 3600.0   # the longest a loop sleeps before it runs (and computes its next delay) again


class Ticker:
    def __init__(self, name: str, fn: Callable[[], float | None], first_delay: float) -> None:
        self.fn, self.name = fn, name
        self._delay = first_delay
        self._wake = threading.Event()
        self._stopped = threading.Event()
        context = contextvars.copy_context()
        self.thread = threading.Thread(target=context.run, args=(self._run,), name=name, daemon=True)

    def start(self) -> Ticker:
        self.thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def _run(self) -> None:
        delay = self._delay
        while not self._stopped.is_set():
            # Bounded: Event.wait raises OverflowError past threading.TIMEOUT_MAX, which ended
            # the loop for good; a run that comes early only computes its delay again.
            self._wake.wait(min(max(0.0, delay), MAX_WAIT_S))
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                delay = self.fn()
            except Exception:  # noqa: BLE001 - one failed run must not end the loop
                log.exception("%s failed; trying again in %gs", self.name, ERROR_DELAY_S)
                delay = ERROR_DELAY_S
            if delay is None:
                self._stopped.set()


class ClusterLoops:
    """The loops of every cluster the operator sees, by (namespace, name)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._loops: dict[tuple[str, str], tuple[str, dict[str, Ticker]]] = {}

    def ensure(self, namespace: str, name: str, uid: str, make: Callable[[], dict[str, Ticker]]) -> bool:
        """Start the cluster's loops unless they run (for this uid: a cluster deleted and
        created again under the same name gets new ones). True when started now."""
        key = (namespace, name)
        with self._guard:
            current = self._loops.get(key)
            if current is not None and current[0] == uid and not all(t.stopped for t in current[1].values()):
                return False
            if current is not None:
                for ticker in current[1].values():
                    ticker.stop()
            tickers = make()
            self._loops[key] = (uid, tickers)
        for ticker in tickers.values():
            ticker.start()
        return True

    def wake(self, namespace: str, name: str, loop: str) -> None:
        with self._guard:
            current = self._loops.get((namespace, name))
        ticker = current[1].get(loop) if current else None
        if ticker is not None:
            ticker.wake()

    def current(self, namespace: str, name: str, uid: str) -> bool:
        """Whether `uid` is the incarnation whose loops run: a tick that was under way when its
        cluster was deleted (or deleted and created again) learns here that it is stale."""
        with self._guard:
            current = self._loops.get((namespace, name))
        return current is not None and current[0] == uid

    def stop(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Stop the cluster's loops (only `uid`'s, when given: a late deletion of an old
        incarnation must not stop a new one of the same name)."""
        with self._guard:
            current = self._loops.get((namespace, name))
            if current is None or (uid is not None and current[0] != uid):
                return
            del self._loops[(namespace, name)]
        for ticker in current[1].values():
            ticker.stop()

    def stop_all(self, join_s: float = 5.0) -> None:
        with self._guard:
            everything = [t for _, tickers in self._loops.values() for t in tickers.values()]
            self._loops.clear()
        for ticker in everything:
            ticker.stop()
        for ticker in everything:
            ticker.thread.join(join_s)

    def running(self) -> list[tuple[str, str]]:
        with self._guard:
            return sorted(self._loops)
