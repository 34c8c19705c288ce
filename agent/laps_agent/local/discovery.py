"""`laps local`'s gateway membership: its engine child processes, less the exited ones."""
from __future__ import annotations

from typing import Callable

from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
from laps_agent.local.engines import EngineChild
from laps_agent.policy.classes import LONG


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

    async def adopt(self, child: EngineChild) -> None:
        """A new engine (`laps local --autoscale` started it): in the membership, routed to once
        it answers (StaticDiscovery), followed like the others."""
        self._children[child.url] = child
        spec = self.spec
        if child.role == "decode":
            spec = StaticSpec(spec.prefill_short, spec.prefill_long, (*spec.decode, child.url))
        elif child.group == LONG:
            spec = StaticSpec(spec.prefill_short, (*spec.prefill_long, child.url), spec.decode)
        else:
            spec = StaticSpec((*spec.prefill_short, child.url), spec.prefill_long, spec.decode)
        await self.update(spec)

    async def retire(self, url: str) -> None:
        """An engine leaving (a scale-down): out of the membership now, so nothing new goes to
        it; its exit, which follows, is not a failure."""
        self._children.pop(url, None)
        spec = self.spec
        await self.update(StaticSpec(*(tuple(u for u in urls if u != url)
                                       for urls in (spec.prefill_short, spec.prefill_long, spec.decode))))

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
