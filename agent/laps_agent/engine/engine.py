"""The engine step loop: LAPS-scheduled prefill batches + continuous-batching decode.

Runs on one dedicated thread (torch releases the GIL inside kernels, so the asyncio server stays
responsive). The HTTP side talks to it only through `submit` / `abort` (thread-safe) and the
per-request output sink.

How prefill and decode interleave (all roles share this loop; a role just leaves one half idle):
each iteration runs at most ONE prefill batch (chosen by `PrefillScheduler.next_batch`), then ONE
decode step for every running request. A decode stream therefore never waits longer than one
prefill batch, and the scheduler's short-first order decides what that batch is. With the
scheduler's waiting window holding short requests and nothing to decode, the thread sleeps until
the window's `wake_at` or until new work arrives.

KV is reserved at admission for prompt + max_new_tokens (capped by the context length), so a
running request can never run out of pages mid-decode and nothing needs to be preempted."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable

from laps_agent.engine.core.config import ROLES, EngineConfig, PrefillRecord  # noqa: F401 (re-exported)
from laps_agent.engine.core.engine_core import EngineCore
from laps_agent.engine.core.requests import GenerateWork, OutputSink

log = logging.getLogger(__name__)


class Engine(EngineCore):
    """EngineCore driven by its own thread; `submit`/`submit_many`/`abort` are thread-safe."""

    def __init__(self, runner: Any, tokenizer: Any, config: EngineConfig, *, grid: Any = None,
                 on_prefill: Callable[[PrefillRecord], None] | None = None,
                 on_first_token: Callable[[str, float], None] | None = None,
                 on_warm: Callable[[str, int], None] | None = None) -> None:
        super().__init__(runner, tokenizer, config, grid=grid, on_prefill=on_prefill,
                         on_first_token=on_first_token, on_warm=on_warm)
        self._cond = threading.Condition()
        self._inbox: deque[tuple[str, Any]] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.snapshot: dict[str, Any] = {"running": 0, "queues": {}, "kv_usage": 0.0, "waiting_kv": 0, "live": 0}

    # ---- thread-safe API -------------------------------------------------------------------
    def start(self) -> None:
        self._publish_snapshot()   # what start-up measured (calibration.py) shows from the first /get_load
        self._thread = threading.Thread(target=self._loop, name="laps-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, work: GenerateWork, sink: OutputSink) -> None:
        with self._cond:
            self._inbox.append(("submit", (work, sink)))
            self._cond.notify_all()

    def submit_many(self, items: list[tuple[GenerateWork, OutputSink]]) -> None:
        """Submit several requests atomically: the loop sees them arrive together."""
        with self._cond:
            self._inbox.extend(("submit", item) for item in items)
            self._cond.notify_all()

    def abort(self, rid: str) -> None:
        with self._cond:
            self._inbox.append(("abort", rid))
            self._cond.notify_all()

    # ---- engine thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        log.info("engine loop started (role=%s, scheduler=%s)", self.config.role,
                 "laps" if self.config.scheduler.enabled else "fifo")
        while True:
            with self._cond:
                if self._stopping:
                    break
            try:
                worked, wake_at = self._iterate()
            except Exception as exc:  # noqa: BLE001 - a bug must fail requests, not kill serving
                log.exception("engine iteration failed; failing the requests in flight")
                self._fail_all(f"internal engine error: {exc}")
                worked, wake_at = True, None
            self._publish_snapshot()
            if not worked:
                self._idle(wake_at)
        self._drain_inbox()
        self._fail_all("engine stopped")

    def _iterate(self) -> tuple[bool, float | None]:
        self._drain_inbox()
        worked = self._admit_imports()
        wake_at = None
        if len(self._running) < self.config.max_running_requests:
            ran, wake_at = self._prefill_once()
            worked |= ran
        if self._running:
            self._decode_once()
            worked = True
        if not worked:
            worked = self._warm_idle()
        return worked, wake_at

    def _idle(self, wake_at: float | None) -> None:
        timeout = self.config.idle_wait_s
        if wake_at is not None:
            timeout = max(0.0, min(timeout, wake_at - time.monotonic()))
        with self._cond:
            if not self._inbox and not self._stopping and timeout > 0:
                self._cond.wait(timeout)

    def _drain_inbox(self) -> None:
        with self._cond:
            commands = list(self._inbox)
            self._inbox.clear()
        for kind, payload in commands:
            if kind == "submit":
                self._accept(*payload)
            else:
                self._abort(payload)

    def _run_prefill(self, batch: list, queue: str | None) -> None:
        # Published before the forward pass, which can take seconds: the batch has left the
        # queues, and readers of the snapshot (/get_load) must still see its work as pending.
        self._publish_snapshot(prefilling=(len(batch), sum(item.uncached for item in batch)))
        super()._run_prefill(batch, queue)

    def _publish_snapshot(self, prefilling: tuple[int, int] = (0, 0)) -> None:
        self.snapshot = {"running": len(self._running), "queues": self.scheduler.pending(),
                         "prefilling": prefilling, "kv_usage": self.kv.usage_ratio(),
                         "waiting_kv": len(self._imports), "live": len(self._live),
                         "prefix_cache_pages": self.kv.cached_pages, "warms": len(self.warms),
                         "prefill_cost": self.scheduler.prefill_cost()}
