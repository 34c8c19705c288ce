"""Engine-reported load, so that several gateway replicas (or workers) route by what the engines
hold: alone, each sees only its own in-flight work, and least-pending routing sends all of them
to the same idle-looking pod.

Every gateway polls each pod's `GET /get_load` (engine/core/load_report.py; on stock SGLang,
`/v1/loads`) every `interval_s`. Routing and admission then see, per pod,

    own + max(0, reported - own when that poll was sent)

`own`: this gateway's pending work on the pod now (load.py); `reported`: the engine's last answer
(requests waiting, in a KV transfer or decoding; uncached prompt tokens not yet prefilled), which
included this gateway's work of that moment. So the other replicas' work is at most one interval
old while this gateway's own is current: a burst between two polls is still spread, and finished
requests stop counting at once. A pod without a usable answer (no such route, down, older than
`stale_after_s`) counts its own work alone. Polling never touches health (load.py judges pods by
the requests they serve). Each class's requests on a decode pod (the decode share, admission.py)
merge the same way from `held_by_class` (SGLang has none: each gateway counts its own), this
gateway's part taken as those held when the poll was sent plus those sent since (why:
docs/design/overload.md). The longest prompt a pod takes (context.py) is kept here too: our
engines report it in every answer; stock SGLang's is asked once per pod, again after a failed
poll, apart from the polls (sglang_limit.py)."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from laps_agent.gateway.discovery.membership import Discovery
from laps_agent.gateway.proxy.sglang_limit import ANY_LENGTH, SGLangLimits
from laps_agent.gateway.proxy.upstream import UpstreamError, UpstreamPool, UpstreamTimeout, address
from laps_agent.modelio.prompt_rules import PromptLimit
from laps_agent.policy.allocation import fleet_cost
from laps_agent.policy.placement import PrefillCost
from laps_agent.policy.routing import Endpoint, EndpointLoad

log = logging.getLogger(__name__)
_IDLE = EndpointLoad()
# Per class: (requests this gateway holds on a pod, requests it ever sent there); LoadTracker.held_on.
OwnHeld = Mapping[str, tuple[int, int]]
_NONE_HELD: OwnHeld = {}


class LoadReport(NamedTuple):
    """What a pod's /get_load (or SGLang's /v1/loads) said; see parse_report."""
    requests: int
    tokens: int
    slots: int | None = None                 # max running requests; None: not reported
    held: Mapping[str, int] | None = None    # requests held per class; None: not reported
    max_prompt: int | None = None            # longest prompt it takes; None: not reported
    capacity: int | None = None              # its max_pending_tokens; None: not reported
    cost: PrefillCost | None = None          # its measured prefill cost; None: not reported
    short: tuple[int, int] | None = None     # (requests, tokens) of its queued shorts; None: not reported
    batch_tokens: int | None = None          # its max_prefill_tokens; None: not reported
    long_batch_tokens: int | None = None     # its max_long_batch_tokens (0: all); None: not reported


@dataclass(slots=True)
class _Pod:
    reported: tuple[int, int] | None = None   # (requests, tokens) of the engine's last answer
    own_then: tuple[int, int] = (0, 0)        # this gateway's own pending work when it asked
    asked_at: float = float("-inf")           # when that poll was sent
    slots: int | None = None                  # requests it decodes at once, as last reported
    held: Mapping[str, int] | None = None     # its held_by_class in that answer, if it had one
    held_then: dict[str, int] = field(default_factory=dict)  # of which this gateway's, at most
    max_prompt: PromptLimit | None = None     # longest prompt it takes (ANY_LENGTH: any); None: unknown
    capacity: int | None = None               # its max_pending_tokens, as last reported
    cost: PrefillCost | None = None           # its prefill cost, as last reported
    short: tuple[int, int] | None = None      # its queued shorts in that answer, if it had them
    own_short_then: tuple[int, int] = (0, 0)  # this gateway's short work on it when it asked
    batch_tokens: int | None = None           # its max_prefill_tokens, as last reported
    long_batch_tokens: int | None = None      # its max_long_batch_tokens, as last reported


class EngineLoads:
    """The merge (pure bookkeeping on the caller's clock; EngineLoadPoller feeds it)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.stale_after_s = max(5 * interval_s, 1.0)
        self._clock = clock
        self._pods: dict[str, _Pod] = {}

    def asking(self, name: str, own: EndpointLoad, own_held: OwnHeld = _NONE_HELD) -> tuple:
        """Mark the moment a poll of `name` is sent, with this gateway's own pending work on it
        then; give the mark to `answered`."""
        if name not in self._pods:
            self._pods[name] = _Pod()
        return (own.pending_requests, own.pending_tokens, self._clock(), dict(own_held),
                (own.short_requests, own.short_tokens))

    def answered(self, name: str, mark: tuple, requests: int, tokens: int, slots: int | None = None,
                 held: Mapping[str, int] | None = None, max_prompt: int | None = None,
                 capacity: int | None = None, cost: PrefillCost | None = None,
                 short: tuple[int, int] | None = None, batch_tokens: int | None = None,
                 long_batch_tokens: int | None = None, own_held: OwnHeld = _NONE_HELD) -> None:
        """The answer to the poll `mark`: the pod's figures, and `own_held` as of now."""
        pod = self._pods.get(name)
        if pod is None or mark[2] < pod.asked_at:
            return  # the pod left, or a later poll already answered
        pod.reported, pod.own_then, pod.asked_at = (requests, tokens), (mark[0], mark[1]), mark[2]
        if slots:
            pod.slots = slots
        if max_prompt:
            pod.max_prompt = PromptLimit(max_prompt)
        pod.capacity = capacity
        if cost is not None:
            pod.cost = cost
        if batch_tokens:
            pod.batch_tokens = batch_tokens
        if long_batch_tokens is not None:
            pod.long_batch_tokens = long_batch_tokens
        pod.short, pod.own_short_then = short, mark[4]
        pod.held, pod.held_then = held, _own_part(mark[3], own_held)

    def slots(self, name: str) -> int | None:
        """The pod's decode slots (max running requests) as it last reported them, however
        long ago: a setting of the engine, not a load, so an old answer still holds."""
        pod = self._pods.get(name)
        return pod.slots if pod is not None else None

    def capacity(self, name: str) -> int | None:
        """The prompt tokens pod `name` expects to prefill in time (its max_pending_tokens,
        engine/load_report.py) as of its last fresh answer; None without one. A measurement
        that follows the traffic, unlike slots: an old one is not kept."""
        pod = self._pods.get(name)
        return pod.capacity if pod is not None and self._fresh(pod, self._clock()) else None

    def cost(self, name: str) -> PrefillCost | None:
        """Pod `name`'s prefill cost as it last reported it, however long ago (a property of
        its hardware and model, like slots); None while it has not."""
        pod = self._pods.get(name)
        return pod.cost if pod is not None else None

    def fleet_cost(self) -> PrefillCost | None:
        """The prefill pods' measured cost as one figure (allocation.fleet_cost), None while no
        pod has reported one; decode pods report none."""
        return fleet_cost(pod.cost for pod in self._pods.values())

    def batch_tokens(self, name: str) -> int | None:
        """Pod `name`'s largest prefill batch in tokens as it last reported it (a setting)."""
        pod = self._pods.get(name)
        return pod.batch_tokens if pod is not None else None

    def long_batch_tokens(self, name: str) -> int | None:
        """Pod `name`'s long batch budget (its max_long_batch_tokens, 0: its whole batch) as it
        last reported it (a setting); None while it has not."""
        pod = self._pods.get(name)
        return pod.long_batch_tokens if pod is not None else None

    def learnt_limit(self, name: str, limit: PromptLimit | None) -> None:
        """The longest prompt pod `name` takes, learnt apart from its load (stock SGLang's;
        ANY_LENGTH: it truncates a longer one; None: unknown, or a figure it does not publish)."""
        pod = self._pods.get(name)
        if pod is not None:   # else the pod left meanwhile
            pod.max_prompt = limit

    def max_prompt_tokens(self, names: Iterable[str]) -> PromptLimit | None:
        """The longest prompt any of the pods `names` takes, as they last reported it (a
        setting, like slots); None while none has said, or when one takes any length. The
        largest, so that a prompt refused on it would have been refused on every one of them."""
        limits = [pod.max_prompt for name in names if (pod := self._pods.get(name)) and pod.max_prompt]
        largest = max(limits, key=lambda limit: limit.tokens) if limits else None
        return None if largest == ANY_LENGTH else largest

    def others_held(self, name: str, cls: str) -> int:
        """Requests of class `cls` that other gateway replicas hold on pod `name`, as of its
        last fresh answer (0 without one, or when it reports no classes)."""
        pod = self._pods.get(name)
        if pod is None or pod.held is None or not self._fresh(pod, self._clock()):
            return 0
        return max(0, pod.held.get(cls, 0) - pod.held_then.get(cls, 0))

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget pods that left the membership."""
        keep = set(names)
        for name in [n for n in self._pods if n not in keep]:
            del self._pods[name]

    def _fresh(self, pod: _Pod, now: float) -> bool:
        return pod.reported is not None and now - pod.asked_at <= self.stale_after_s

    def _others(self, pod: _Pod, now: float) -> tuple[int, int]:
        """(requests, tokens) other gateway replicas had on the pod at its last fresh answer."""
        return _excess(pod.reported, pod.own_then) if self._fresh(pod, now) else (0, 0)

    @staticmethod
    def _others_short(pod: _Pod) -> tuple[int, int]:
        """Of the other replicas' work on a freshly answered pod, the queued shorts (none where
        the pod does not report them: their work then counts as long, the cautious guess for a
        short request, which waits behind long work only while a batch of it runs)."""
        return (0, 0) if pod.short is None else _excess(pod.short, pod.own_short_then)

    def merged(self, own: Mapping[str, EndpointLoad]) -> Mapping[str, EndpointLoad]:
        """The load routing sees: `own` where no answer adds to it (then `own` itself)."""
        view: dict[str, EndpointLoad] | None = None
        now = self._clock()
        for name, pod in self._pods.items():
            requests, tokens = self._others(pod, now)
            if requests or tokens:
                if view is None:
                    view = dict(own)
                mine = own.get(name, _IDLE)
                short_requests, short_tokens = self._others_short(pod)
                # No batch_since: the batch running may be another gateway's, begun when this one
                # cannot know (placement credits none).
                view[name] = EndpointLoad(mine.pending_requests + requests, mine.pending_tokens + tokens,
                                          mine.healthy, mine.short_requests + min(short_requests, requests),
                                          mine.short_tokens + min(short_tokens, tokens))
        return own if view is None else view

    def report(self, name: str) -> dict | None:
        """The engine's last answer about `name` and its age (for /laps_status), or None."""
        pod = self._pods.get(name)
        now = self._clock()
        if pod is None or not self._fresh(pod, now):
            return None
        report = {"requests": pod.reported[0], "tokens": pod.reported[1],
                  "age_s": round(now - pod.asked_at, 3)}
        if pod.held is not None:
            report["held_by_class"] = dict(pod.held)
        if pod.capacity is not None:
            report["max_pending_tokens"] = pod.capacity
        return report


def _excess(reported: tuple[int, int], own_then: tuple[int, int]) -> tuple[int, int]:
    """(requests, tokens) a pod reported beyond this gateway's own work when it asked: the
    other replicas' (never below zero: this gateway's own may have ended meanwhile)."""
    return max(0, reported[0] - own_then[0]), max(0, reported[1] - own_then[1])


def _own_part(then: OwnHeld, now: OwnHeld) -> dict[str, int]:
    """Per class, the most of this gateway's requests an answer can hold: those held when the
    poll was sent (`then`) plus those sent since (up to `now`, when the answer came)."""
    own = {}
    for cls in then.keys() | now.keys():
        held, sent = then.get(cls, (0, 0))      # a class never sent there had sent nothing
        own[cls] = held + now.get(cls, (held, sent))[1] - sent
    return own


def _cost(doc: dict | None) -> PrefillCost | None:
    if doc is None:
        return None
    overhead, per_token = float(doc["overhead_s"]), float(doc["per_token_s"])
    if not (0 <= overhead < float("inf") and 0 <= per_token < float("inf")):
        raise ValueError(f"not a prefill cost: {doc!r}")
    return PrefillCost(overhead, per_token)


def _pair(doc: list | None) -> tuple[int, int] | None:
    return None if doc is None else (int(doc[0]), int(doc[1]))


# Where an engine reports its load: this project's engines answer LOAD_PATH; stock SGLang
# (the sglang backend) has no such route but reports the same figures per data-parallel rank at
# SGLANG_LOAD_PATH, asked once LOAD_PATH answered 404.
LOAD_PATH = "/get_load"
SGLANG_LOAD_PATH = "/v1/loads?include=core"


def parse_report(body: bytes) -> LoadReport:
    """A /get_load answer, or SGLang's /v1/loads (summed over its ranks: requests waiting, in a
    KV transfer or running; uncached prompt tokens waiting; max running requests; it has no
    classes, nor its longest prompt: SGLangLimits asks that); ValueError when it is neither.
    Fields an older engine lacks are None."""
    try:
        doc = json.loads(body)
        if "loads" in doc:
            ranks = doc["loads"]
            return LoadReport(sum(int(r["num_waiting_reqs"]) + int(r["num_running_reqs"]) for r in ranks),
                              sum(int(r.get("num_waiting_uncached_tokens", 0)) for r in ranks),
                              sum(int(r.get("max_running_requests", 0)) for r in ranks) or None)
        requests = (int(doc["waiting_requests"]) + int(doc.get("running_requests", 0))
                    + int(doc.get("transfer_requests", 0)))
        held = doc.get("held_by_class")   # absent from older engines' reports
        return LoadReport(requests, int(doc["pending_tokens"]),
                          int(doc.get("max_running_requests", 0)) or None,
                          None if held is None else {str(cls): int(n) for cls, n in held.items()},
                          int(doc.get("max_prompt_tokens", 0)) or None,
                          int(doc.get("max_pending_tokens", 0)) or None,
                          _cost(doc.get("prefill_cost")), _pair(doc.get("short_pending")),
                          int(doc.get("max_prefill_tokens", 0)) or None,
                          _budget(doc.get("max_long_batch_tokens")))
    except (KeyError, TypeError, AttributeError, OverflowError, IndexError) as exc:
        # OverflowError: a number JSON reads as infinite (1e400), which no count is.
        raise ValueError(f"not a load report: {exc!r}") from None


def _budget(value) -> int | None:
    """A reported max_long_batch_tokens: None when absent (an older engine), >= 0 (0: all)."""
    if value is None:
        return None
    if int(value) < 0:
        raise ValueError(f"not a load report: max_long_batch_tokens {value} < 0")
    return int(value)


class EngineLoadPoller:
    """Polls every discovered pod's /get_load each `loads.interval_s`, on keep-alive connections
    of its own (short timeouts, never queued behind a generation)."""

    def __init__(self, loads: EngineLoads, discovery: Discovery,
                 own: Callable[[], Mapping[str, EndpointLoad]], *, enabled: bool = True,
                 own_held: Callable[[str], OwnHeld] = lambda name: _NONE_HELD) -> None:
        self.loads, self._discovery, self._own, self._enabled = loads, discovery, own, enabled
        self._own_held = own_held
        # An answer later than the next poll is of no use.
        self._timeout_s = max(loads.interval_s, 0.05)
        self._pool = UpstreamPool(connect_timeout=self._timeout_s, read_timeout=self._timeout_s,
                                  max_idle_per_host=2)
        self._task: asyncio.Task | None = None
        self._paths: dict[str, str] = {}   # pods that answered LOAD_PATH with 404: SGLang's route
        self._sglang_limits = SGLangLimits(loads)

    async def start(self) -> None:
        if self._enabled:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-load-poller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._sglang_limits.stop()
        await self._pool.aclose()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        said: type | None = None   # the kind of failure last logged, until a cycle goes through
        while True:
            try:
                await self._cycle()
                said = None
            except Exception as exc:  # noqa: BLE001 - a bug: the poller must outlive it
                # Ended, the poller took with it the engines' load, the decode slots and the
                # measured admission bounds, for the rest of the process, saying nothing.
                # Logged once per kind while it repeats (a cycle runs 4 times a second).
                if type(exc) is not said:
                    log.error("engine load poll failed; polling goes on", exc_info=exc)
                said = type(exc)
            next_at = max(next_at + self.loads.interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _cycle(self) -> None:
        pods = {e.name: e for e in self._discovery.membership().endpoints()}
        self.loads.keep_only(pods)
        for gone in [name for name in self._paths if name not in pods]:
            del self._paths[gone]
        self._sglang_limits.keep_only(pods)
        self._pool.keep_only({address(e.url) for e in pods.values()})
        # Every pod's poll ends before the next cycle, whatever one of them raised.
        results = await asyncio.gather(*(self._poll(e) for e in pods.values()), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                raise result

    async def _poll(self, endpoint: Endpoint) -> None:
        mark = self.loads.asking(endpoint.name, self._own().get(endpoint.name, _IDLE),
                                 self._own_held(endpoint.name))
        path = self._paths.get(endpoint.name, LOAD_PATH)
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._pool.get(*address(endpoint.url), path)
                body = await response.read()
            if response.status == 404 and path == LOAD_PATH:
                self._paths[endpoint.name] = SGLANG_LOAD_PATH  # from the next poll on
                return
            if response.status != 200:   # an engine with neither route: its own work alone counts
                raise ValueError(f"{path} answered {response.status}")
            report = parse_report(body)
        except (TimeoutError, UpstreamTimeout) as exc:
            log.debug("no load report from %s in time: %s", endpoint.name, exc)
            return
        except (UpstreamError, ValueError) as exc:
            log.debug("no load report from %s: %s", endpoint.name, exc)
            self._sglang_limits.forget(endpoint.name)   # it may be another SGLang when it is back
            return
        if path == SGLANG_LOAD_PATH:   # stock SGLang, up: its limit is asked apart, once
            self._sglang_limits.ask(endpoint)
        self.loads.answered(endpoint.name, mark, *report, own_held=self._own_held(endpoint.name))
