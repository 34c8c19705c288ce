"""`laps local`'s gateway membership: its engine child processes, less the exited ones."""
from __future__ import annotations

from typing import Callable

from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
from laps_agent.local.engines import EngineChild


class LocalDiscovery(StaticDiscovery):
    """The gateway's membership in `laps local`: the engines it started, less those whose
    process has exited, as Kubernetes drops a dead pod's endpoints. Without this, a dead engine
    stayed in its group: routed to again whenever its ejection ran out, counted in its group's
    admission bound, and the first pod the allocation loop moved (it holds no work).
    Nothing restarts an engine here, so once no prefill or no decode engine is left, every
    request would fail for good: it says so, sets `unservable` and calls `on_unservable` (the
    gateway's drain: `laps local` then stops, exit status 1) rather than serve 503s silently."""

    def __init__(self, spec: StaticSpec, children: list[EngineChild], say: Callable[[str], None],
                 poll_s: float = 0.5) -> None:
        super().__init__(spec, poll_s=poll_s)
        self._children = {c.url: c for c in children}
        self._say = say
        self.unservable: str | None = None
        self.on_unservable: Callable[[], None] = lambda: None

    async def _refresh(self) -> None:
        gone = {url for url, child in self._children.items() if child.process.poll() is not None}
        for url in gone:  # poll() also reaps the process
            child = self._children.pop(url)
            self._say(f"{child.name} exited with {child.process.returncode}; no longer routed to "
                      f"(its log: {child.log_path})")
        if gone:
            spec = self.spec
            self._spec = StaticSpec(*(tuple(u for u in urls if u not in gone)
                                      for urls in (spec.prefill_short, spec.prefill_long, spec.decode)))
            spec = self._spec
            empty = [role for role, urls in (("prefill", spec.prefill_short + spec.prefill_long),
                                             ("decode", spec.decode)) if not urls]
            if empty and self.unservable is None:
                self.unservable = f"no {' and no '.join(empty)} engine left: nothing can be served"
                self._say(f"error: {self.unservable}; stopping (start laps local again)")
                self.on_unservable()
        await super()._refresh()
