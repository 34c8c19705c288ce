"""EngineCore's steps for work that crosses engines in a PD pair: the decode role imports the KV a
prefill engine sent (`_admit_imports`), the prefill role exports a prefilled prompt's KV for the
decode engine (`_hand_off`) and computes the prefix warms decode engines send back (`_warm_idle`).

Separate from engine_core.py so that module reads as the one engine's own loop (admission, prefill
batches, decode steps, stops); these run on the same engine thread, as part of that loop."""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from laps_agent.engine.core.config import EngineConfig
from laps_agent.engine.core.kv_cache import KVCacheFull, PagedKVAllocator
from laps_agent.engine.core.requests import EngineOutput
from laps_agent.engine.model.runner import ForwardItem
from laps_agent.engine.pd.prefix_warm import WarmQueue
from laps_agent.policy.scheduling.queues import PrefillScheduler

if TYPE_CHECKING:
    from laps_agent.engine.core.engine_core import _Live

log = logging.getLogger("laps_agent.engine.engine")  # the loop's logger, as engine_core.py


class PDSteps:
    """Mixed into EngineCore, whose state and helpers these use (`_reserve_tokens`, `_pages`,
    `_take_token`, `_fail`, `_emit`, `_decode_text`): the attributes below are EngineCore's."""

    runner: Any
    config: EngineConfig
    kv: PagedKVAllocator
    scheduler: PrefillScheduler
    warms: WarmQueue
    on_first_token: Callable[[str, float], None] | None
    _live: dict[str, _Live]
    _running: list[str]
    _imports: deque[str]

    def _admit_imports(self) -> bool:
        worked = False
        while self._imports and len(self._running) < self.config.max_running_requests:
            rid = self._imports[0]
            live = self._live[rid]
            work = live.work
            try:
                pages = self.kv.allocate(rid, self._reserve_tokens(work))
            except KVCacheFull:
                return worked
            self._imports.popleft()
            worked = True
            try:
                n = len(work.input_ids)
                self.runner.import_kv(pages[: self.kv.pages_for(n)], work.kv)
            except Exception as exc:  # noqa: BLE001 - a bad transfer must not kill the loop
                log.exception("KV import failed for %s", rid)
                self._fail(rid, f"KV import failed: {exc}")
                continue
            work.kv = None  # drop the CPU copy now that the pool holds it
            self._take_token(live, work.first_token, first=True)
        return worked

    def _hand_off(self, live: _Live, token: int) -> None:
        rid = live.work.rid
        try:
            kv = self.runner.export_kv_async(self._pages(rid, len(live.work.input_ids)), len(live.work.input_ids))
        except Exception as exc:  # noqa: BLE001
            log.exception("KV export failed for %s", rid)
            self._fail(rid, f"KV export failed: {exc}")
            return
        self.kv.free(rid)
        self._live.pop(rid, None)
        ttft = time.monotonic() - live.work.arrival
        if self.on_first_token is not None:
            self.on_first_token(live.cls, ttft)
        self._emit(live, EngineOutput(
            rid, token_ids=[token], text=self._decode_text([token]), finished=True,
            finish_reason="prefilled", prompt_tokens=len(live.work.input_ids), completion_tokens=1,
            cached_tokens=live.cached, kv=kv, ttft_s=ttft, cls=live.cls))

    def _warm_idle(self) -> bool:
        """One warm chunk, if nothing else could run: no prefill waiting (nor held by the
        waiting window), nothing decoding or importing. Returns whether it computed."""
        if not self.warms or len(self.scheduler) or self._running or self._imports:
            return False
        chunk = self.warms.next_chunk(lambda w: self.kv.match(w.ids))
        if chunk is None:
            return False
        warm, _, end = chunk
        try:
            self.kv.allocate(warm.rid, end, warm.ids[:end])
        except KVCacheFull:  # the pool is busy with real work: not worth an eviction fight
            self.warms.drop("dropped")
            return False
        cached = self.kv.cached_tokens(warm.rid)
        item = ForwardItem(token_ids=list(warm.ids[cached:end]), start_pos=cached, pages=self._pages(warm.rid, end))
        try:
            self.runner.forward([item], bucketed=False)
        except Exception:  # noqa: BLE001 - a warm is an optimisation: never fail the loop for it
            log.exception("prefix warm failed")
            self.kv.free(warm.rid)
            self.warms.drop("failed")
            return True
        self.kv.insert(warm.rid, warm.ids[:end])
        self.kv.free(warm.rid)
        self.warms.advance(warm, end, end - cached)
        return True
