"""The PD hand-off of one engine: the work that crosses engines in a PD pair. EngineCore
(engine_core.py) owns one beside its scheduler and calls its steps on the engine thread:

- decode role: the KV a prefill engine sent waits here for pages (`imports`), then is copied into
  this engine's pool (`admit_import`, `import_kv`), after which the request decodes here;
- prefill role: a prefilled prompt's KV is copied out for the decode engine (`export`), and the
  prefix warms decode engines send back are computed while nothing else could run (`warm_idle`,
  on the queue of core/warm_queue.py).

It holds the cross-engine state (imports waiting for pages, the warm queue) and does the KV moves
(import, export, a warm's forward pass); the requests themselves (outputs, failures, the running
set) stay EngineCore's, which acts on what these steps return or raise."""
from __future__ import annotations

import logging
from typing import Any

from laps_agent.engine.core.forward import ForwardItem, Runner
from laps_agent.engine.core.kv_cache import KVCacheFull, PagedKVAllocator
from laps_agent.engine.core.requests import GenerateWork
from laps_agent.engine.core.warm_queue import Warm, WarmQueue
from laps_agent.policy.scheduling.decode_order import next_admitted

log = logging.getLogger("laps_agent.engine.engine")  # the loop's logger, as engine_core.py


class PDHandoff:
    def __init__(self, runner: Runner, kv: PagedKVAllocator, warms: WarmQueue) -> None:
        self.runner, self.kv, self.warms = runner, kv, warms
        # Decode role: KV arrived, waiting for pages, in arrival order: rid -> when its first
        # token is due (DecodeOrder.deadline; 0 without one).
        self.imports: dict[str, float] = {}

    def __contains__(self, rid: str) -> bool:
        return rid in self.imports

    # ---- decode role: KV from a prefill engine -----------------------------------------------
    def queue_import(self, rid: str, due: float = 0.0) -> None:
        self.imports[rid] = due

    def next_import(self, by_deadline: bool, now: float) -> str | None:
        """The import that takes the next free slot: by deadline (decode_order.next_admitted),
        else the oldest; None when none waits."""
        if not by_deadline:
            return next(iter(self.imports), None)
        return next_admitted(self.imports, self.imports.__getitem__, now)

    def forget(self, rid: str) -> None:
        """`rid` was aborted or failed: it no longer waits for pages."""
        self.imports.pop(rid, None)

    def admit_import(self, rid: str, reserve_tokens: int) -> list[int]:
        """Pages for import `rid`, which leaves the queue; KVCacheFull (nothing taken, it
        keeps its place) while the pool has no room for it."""
        pages = self.kv.allocate(rid, reserve_tokens)
        del self.imports[rid]
        return pages

    def import_kv(self, pages: list[int], work: GenerateWork) -> None:
        """Copy the KV that came with `work` into its pages; raises what the copy raised (a bad
        transfer: the caller fails that request, which frees its pages)."""
        self.runner.import_kv(pages[: self.kv.pages_for(len(work.input_ids))], work.kv)
        work.kv = None  # drop the CPU copy now that the pool holds it

    # ---- prefill role: KV to a decode engine, warms back from it -----------------------------
    def export(self, rid: str, prompt_tokens: int) -> Any:
        """The prompt's KV on its way out (kv_export.py: the copy is under way) and its pages
        freed; raises what the export raised, the pages still held."""
        kv = self.runner.export_kv_async(self.kv.pages_covering(rid, prompt_tokens), prompt_tokens)
        self.kv.free(rid)
        return kv

    def add_warm(self, work: GenerateWork) -> None:
        """A warm's ids to compute into the prefix cache; refused where this engine keeps none."""
        if self.kv.cache is None:
            self.warms.report("refused", 0)
        else:
            self.warms.add(Warm(list(work.input_ids), len(work.input_ids), work.rid))

    def warm_idle(self, busy: bool) -> bool:
        """One warm chunk, if nothing else could run: not `busy` (a prefill waiting or held by
        the waiting window, anything decoding) and no import waiting. Returns whether it
        computed."""
        if not self.warms or busy or self.imports:
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
        item = ForwardItem(token_ids=list(warm.ids[cached:end]), start_pos=cached,
                           pages=self.kv.pages_covering(warm.rid, end))
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
