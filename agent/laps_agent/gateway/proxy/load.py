"""What the gateway itself knows about each pod's load and health.

A *prefill* pod's pending work, and its class's (the pressure on the group of that name, which
the allocation loop balances: where the router sent it does not change which kind of pod it
wants), count from dispatch until the request's
prefill phase completes, seen as the first of: the prefill engine's response ending (SGLang's
prefill server answers once the KV is handed off), the first byte of the decode engine's answer,
the attempt failing or being cancelled; its running batch is taken to begin at the first
dispatch to it idle and again at each prefill end while work remains (EndpointLoad.batch_since:
the router credits what that batch has done). A *decode* pod's pending requests count until the
whole answer is relayed; so do each class's requests on the decode pool (its decode share,
admission.py) and on each decode pod (with those ever sent there: what engine_load.py takes out
of the pod's own per-class report). What the decode share counts of them (`decode_share_held`)
leaves out the requests still queued for a prefill predicted to end later than their class's
answers lately held a slot (admission.share_counted): each request's `DecodeHold` records its
predicted prefill end, its hand-off, and at its end how long it held its slot.
Health is passive: `eject_after_failures` failed calls in a row make a pod unhealthy for
`eject_seconds`; one success resets its count. Ejection is capped per pool (a prefill group, or
the decode pool; policy/outlier.py): a pod whose ejection would take out its pool's last healthy
pod, or more than `max_ejection_percent` of it, stays routable and its count starts over. A pod
that answered 503 `draining` is out of routing for `eject_seconds` too, as no failure and under
no cap (it refuses every new request anyway); then one that has gone fails fast, one that came
back serves.
Pods that leave the membership are forgotten (`follow`: with Kubernetes discovery every rollout
brings new names, which a long-lived gateway would otherwise keep forever); one still holding
requests of this gateway when the last of them ends (their counts stay right). A name that comes
back after that starts afresh (no failures, no ejection), as the prefix record treats it
(affinity.py)."""
from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from laps_agent.gateway.config import ProxyConfig
from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.policy.admission import residence_update, share_counted
from laps_agent.policy.classes import CLASSES, SHORT
from laps_agent.policy.outlier import may_eject
from laps_agent.policy.routing import EndpointLoad

log = logging.getLogger(__name__)


@dataclass
class _GroupPending:
    requests: int = 0
    tokens: int = 0


class DecodeHold:
    """One request's place in its class's decode share, from dispatch to its answer's end:
    while its prefill is to come, its predicted end (`prefill_end_at`, the tracker's clock;
    None: not predicted, counted at once), then the moment of its hand-off."""

    __slots__ = ("cls", "prefill_end_at", "handed_off_at", "ended")

    def __init__(self, cls: str, prefill_end_at: float | None) -> None:
        self.cls, self.prefill_end_at = cls, prefill_end_at
        self.handed_off_at: float | None = None
        self.ended = False

    @property
    def waiting(self) -> bool:
        """Counted by its predicted prefill end (not handed off, and predicted)."""
        return self.handed_off_at is None and self.prefill_end_at is not None


class PrefillTicket:
    """One request's share of a prefill pod's pending work; `done()` is idempotent."""

    __slots__ = ("_tracker", "group", "endpoint", "tokens", "short", "_open")

    def __init__(self, tracker: LoadTracker, group: str, endpoint: str, tokens: int, short: bool) -> None:
        self._tracker, self.group, self.endpoint, self.tokens = tracker, group, endpoint, tokens
        self.short = short
        self._open = True

    @property
    def open(self) -> bool:
        return self._open

    def done(self) -> bool:
        """Returns True only for the call that actually closed the ticket."""
        if not self._open:
            return False
        self._open = False
        self._tracker._finish_prefill(self)
        return True


class LoadTracker:
    def __init__(self, metrics: GatewayMetrics, config: ProxyConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics, self._config, self._clock = metrics, config, clock
        self._loads: dict[str, EndpointLoad] = {}
        self._groups: dict[str, _GroupPending] = {group: _GroupPending() for group in CLASSES}
        # The gauges read the counts when scraped: setting them on every request cost ~4
        # metric updates per request for a figure read every few seconds.
        for group, pending in self._groups.items():
            metrics.pending_requests_of[group].set_function(lambda p=pending: p.requests)
            metrics.pending_tokens_of[group].set_function(lambda p=pending: p.tokens)
        self._offered: dict[str, float] = dict.fromkeys(CLASSES, 0.0)   # class -> prefill seconds arrived
        # Each class's requests on the decode pool (DecodeHold), as the decode share counts
        # them: those counted at once, the predicted prefill ends (sorted) of those still
        # waiting, and the seconds its answers have lately held a slot.
        self._share_now: dict[str, int] = {}
        self._share_waiting: dict[str, list[float]] = {}
        self._residence: dict[str, float] = {}
        # pod -> class -> [requests held there now, requests ever sent there]: what this
        # gateway's share of a decode engine's held_by_class can be (engine_load.py)
        self._held_on: dict[str, dict[str, list[int]]] = {}
        self._failures: dict[str, int] = {}
        self._ejected_until: dict[str, float] = {}
        self._members: object | None = None   # the membership `follow` saw last
        self._departed: set[str] = set()      # out of it, kept while requests run there

    def follow(self, membership) -> None:
        """Forget the pods that are not in `membership` (a discovery.Membership) and hold none of
        this gateway's requests; the others once their last request ends. Discovery replaces
        the membership object on every change, so an unchanged one costs one comparison."""
        if membership is self._members:
            return
        self._members = membership
        present = {e.name for e in _pods(membership)}
        self._departed = {name for name in self.pods() if name not in present}
        for name in list(self._departed):
            self._forget_if_idle(name)

    def pods(self) -> set[str]:
        """Every pod this tracker keeps an entry for."""
        return {*self._loads, *self._held_on, *self._failures, *self._ejected_until}

    def _forget_if_idle(self, name: str) -> None:
        # pending_requests counts the pod's prefill tickets and decode requests alike.
        load = self._loads.get(name)
        if load is not None and (load.pending_requests or load.pending_tokens):
            return
        for table in (self._loads, self._held_on, self._failures, self._ejected_until):
            table.pop(name, None)
        self._departed.discard(name)

    def _load(self, name: str) -> EndpointLoad:
        load = self._loads.get(name)
        if load is None:
            load = self._loads[name] = EndpointLoad()
        return load

    def now(self) -> float:
        """The tracker's clock (EndpointLoad.batch_since is on it)."""
        return self._clock()

    def loads(self) -> dict[str, EndpointLoad]:
        """Per-pod load for the routing policy, with ejections that ran out lifted."""
        if self._ejected_until:
            now = self._clock()
            for name, until in list(self._ejected_until.items()):
                if now >= until:
                    del self._ejected_until[name]
                    self._load(name).healthy = True
        return self._loads

    def arrived(self, cls: str, seconds: float) -> None:
        """A request of class `cls` arrived offering `seconds` of prefill work
        (allocation.offered_seconds), routed or refused: the allocation loop's pressure."""
        self._offered[cls] += seconds
        self._metrics.offered_prefill_of[cls].inc(seconds)

    def offered(self) -> dict[str, float]:
        """Class -> the prefill seconds arrived so far (laps_gateway_offered_prefill_seconds_total)."""
        return dict(self._offered)

    def group_pending(self, group: str) -> tuple[int, int]:
        pending = self._groups.get(group)
        return (pending.requests, pending.tokens) if pending else (0, 0)

    def begin_prefill(self, group: str, endpoint: str, tokens: int, cls: str | None = None) -> PrefillTicket:
        """Book `tokens` of prefill work on `endpoint` (of `group`), sent as class `cls`: on the
        pod, and on the pressure of the group named `cls` (of `group` without one)."""
        load = self._load(endpoint)
        if load.pending_requests <= 0:
            load.batch_since = self._clock()
        load.pending_requests += 1
        load.pending_tokens += tokens
        short = cls == SHORT
        if short:
            load.short_requests += 1
            load.short_tokens += tokens
        # Its class's pressure (the group of that name); without a class, the group serving it.
        group = cls or group
        pending = self._groups[group]  # one per group from the start (their gauges read them)
        pending.requests += 1
        pending.tokens += tokens
        return PrefillTicket(self, group, endpoint, tokens, short)

    def _finish_prefill(self, ticket: PrefillTicket) -> None:
        load = self._load(ticket.endpoint)
        load.pending_requests -= 1
        load.pending_tokens -= ticket.tokens
        load.batch_since = self._clock() if load.pending_requests > 0 else None
        if ticket.short:
            load.short_requests -= 1
            load.short_tokens -= ticket.tokens
        pending = self._groups[ticket.group]
        pending.requests -= 1
        pending.tokens -= ticket.tokens
        if ticket.endpoint in self._departed:
            self._forget_if_idle(ticket.endpoint)

    def begin_decode(self, endpoint: str, cls: str, prefill_end_at: float | None = None) -> DecodeHold:
        """Book a request of class `cls` on decode pod `endpoint`, and its place in the decode
        share (its prefill predicted to end at `prefill_end_at`, on this tracker's clock)."""
        self._load(endpoint).pending_requests += 1
        counts = self._held_on.setdefault(endpoint, {}).setdefault(cls, [0, 0])
        counts[0] += 1
        counts[1] += 1
        hold = DecodeHold(cls, prefill_end_at)
        if hold.waiting:
            bisect.insort(self._share_waiting.setdefault(cls, []), prefill_end_at)
        else:
            self._share_now[cls] = self._share_now.get(cls, 0) + 1
        return hold

    def hand_off(self, hold: DecodeHold) -> None:
        """The request's prefill phase ended: it counts in its class's share from now on."""
        if hold.ended or hold.handed_off_at is not None:
            return
        if hold.waiting:
            self._unwait(hold)
            self._share_now[hold.cls] = self._share_now.get(hold.cls, 0) + 1
        hold.handed_off_at = self._clock()

    def end_decode(self, endpoint: str, hold: DecodeHold) -> None:
        """The request `begin_decode` booked as `hold` ended (answered, failed or cancelled)."""
        self._load(endpoint).pending_requests -= 1
        self._held_on[endpoint][hold.cls][0] -= 1
        if not hold.ended:
            hold.ended = True
            if hold.waiting:
                self._unwait(hold)
            else:
                self._share_now[hold.cls] -= 1
            if hold.handed_off_at is not None:
                self._residence[hold.cls] = residence_update(self._residence.get(hold.cls),
                                                             self._clock() - hold.handed_off_at)
        if endpoint in self._departed:
            self._forget_if_idle(endpoint)

    def _unwait(self, hold: DecodeHold) -> None:
        waiting = self._share_waiting[hold.cls]
        del waiting[bisect.bisect_left(waiting, hold.prefill_end_at)]

    def decode_held(self, cls: str) -> int:
        """Requests of class `cls` this gateway holds on the decode pool (dispatch to last byte)."""
        return self._share_now.get(cls, 0) + len(self._share_waiting.get(cls, ()))

    def decode_share_held(self, cls: str) -> int:
        """Of those, the ones its decode share counts now (admission.share_counted)."""
        return self._share_now.get(cls, 0) + share_counted(self._share_waiting.get(cls, ()), self._clock(),
                                                           self._residence.get(cls))

    def held_on(self, endpoint: str) -> dict[str, tuple[int, int]]:
        """Per class, (requests held on `endpoint` now, requests ever sent there)."""
        return {cls: (c[0], c[1]) for cls, c in self._held_on.get(endpoint, {}).items()}

    def record_success(self, endpoint: str) -> None:
        if self._failures.get(endpoint):
            self._failures[endpoint] = 0

    def record_failure(self, endpoint: str, pool: str, members: Sequence[str]) -> bool:
        """Count a failure of `endpoint`, one of `members` (the names of its pool `pool`:
        "short" | "long" | "decode"). Returns whether this failure ejected it."""
        count = self._failures.get(endpoint, 0) + 1
        self._failures[endpoint] = count
        if count < self._config.eject_after_failures:
            return False
        self._failures[endpoint] = 0
        loads = self.loads()  # lifts ejections that ran out, so they do not count against the cap
        if not loads.get(endpoint, _HEALTHY).healthy:
            return False  # already out (a late failure of a call made before its ejection)
        ejected = sum(1 for name in set(members) if not loads.get(name, _HEALTHY).healthy)
        if not may_eject(len(set(members) | {endpoint}), ejected, self._config.max_ejection_percent):
            self._metrics.ejections.labels(pool, "capped").inc()
            return False
        self._take_out(endpoint)
        self._metrics.ejections.labels(pool, "ejected").inc()
        # A state change, said once (the requests it failed are logged at their own level; once
        # it is out, refusals for want of a pod are debug lines, proxy.py).
        log.warning("%s pod %s is out of routing for %.0f s after %d failures in a row", pool, endpoint,
                    self._config.eject_seconds, count)
        return True

    def record_draining(self, endpoint: str, pool: str) -> None:
        """`endpoint` (of `pool`) refused a request because it is draining."""
        if self.loads().get(endpoint, _HEALTHY).healthy:
            self._take_out(endpoint)
            self._metrics.ejections.labels(pool, "draining").inc()

    def _take_out(self, endpoint: str) -> None:
        self._ejected_until[endpoint] = self._clock() + self._config.eject_seconds
        self._load(endpoint).healthy = False


_HEALTHY = EndpointLoad()


def _pods(membership) -> Iterable:
    yield from membership.decode
    for pods in membership.groups.values():
        yield from pods
