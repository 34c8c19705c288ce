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
running request can never run out of pages mid-decode and nothing needs to be preempted.

Who does what (as nano-vllm's LLMEngine owns its Scheduler and ModelRunner): `Engine` owns the
thread, its inbox and the published snapshot; its `EngineCore` (core/engine_core.py, torch-free)
owns the scheduling state and one iteration's steps, with a `PDHandoff` for the work crossing
engines; the `ModelRunner` (model/runner.py) computes, and model/sampling.py picks the tokens."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable

from laps_agent.engine.core.config import ROLES, EngineConfig, PrefillRecord  # noqa: F401 (re-exported)
from laps_agent.engine.core.engine_core import EngineCore
from laps_agent.engine.core.kv_cache import PagedKVAllocator
from laps_agent.engine.core.requests import GenerateWork, OutputSink
from laps_agent.engine.core.warm_queue import WarmQueue
from laps_agent.engine.model.runner import ModelRunner
from laps_agent.engine.model.sampling import sample_each
from laps_agent.policy.scheduling.queues import PrefillScheduler

log = logging.getLogger(__name__)


class Engine:
    """An EngineCore over a ModelRunner, driven by its own thread; `submit`/`submit_many`/`abort`
    are thread-safe, the rest reads what the loop publishes (`snapshot`) or fixed settings."""

    def __init__(self, runner: ModelRunner, tokenizer: Any, config: EngineConfig, *, grid: Any = None,
                 on_prefill: Callable[[PrefillRecord], None] | None = None,
                 on_first_token: Callable[[str, float], None] | None = None,
                 on_warm: Callable[[str, int], None] | None = None) -> None:
        self.runner = runner
        self.core = EngineCore(runner, tokenizer, config, sample=sample_each, grid=grid,
                               on_prefill=on_prefill, on_first_token=on_first_token, on_warm=on_warm,
                               on_prefill_start=lambda n, tokens: self._publish_snapshot((n, tokens)))
        self._cond = threading.Condition()
        self._inbox: deque[tuple[str, Any]] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.snapshot: dict[str, Any] = {"running": 0, "queues": {}, "kv_usage": 0.0, "waiting_kv": 0, "live": 0}

    # ---- what the server and the start-up read (the core's, fixed once built) ------------------
    @property
    def config(self) -> EngineConfig:
        return self.core.config

    @property
    def tokenizer(self) -> Any:
        return self.core.tokenizer

    @property
    def grid(self) -> Any:
        return self.core.grid

    @property
    def kv(self) -> PagedKVAllocator:
        return self.core.kv

    @property
    def scheduler(self) -> PrefillScheduler:
        return self.core.scheduler

    @property
    def warms(self) -> WarmQueue:
        return self.core.warms

    def max_prompt_tokens(self) -> int:
        return self.core.max_prompt_tokens()

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
                self._drain_inbox()
                worked, wake_at = self.core.step()
            except Exception as exc:  # noqa: BLE001 - a bug must fail requests, not kill serving
                log.exception("engine iteration failed; failing the requests in flight")
                self.core.fail_all(f"internal engine error: {exc}")
                worked, wake_at = True, None
            self._publish_snapshot()
            if not worked:
                self._idle(wake_at)
        self._drain_inbox()
        self.core.fail_all("engine stopped")

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
                self.core.accept(*payload)
            else:
                self.core.abort(payload)

    def _publish_snapshot(self, prefilling: tuple[int, int] = (0, 0)) -> None:
        self.snapshot = self.core.snapshot(prefilling)
