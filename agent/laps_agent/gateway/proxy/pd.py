"""The PD proxy: one request -> one prefill pod + one decode pod (SGLang's protocol).

The same JSON body, plus `bootstrap_host`/`bootstrap_port`/`bootstrap_room` (spliced into the
client's bytes: payload.py), goes to both pods concurrently; the decode pod's answer goes back to
the client. Nothing is sent to the client before the decode pod's first byte (streaming) or
whole answer (non-streaming), so until then a connection-level failure of either pod is retried
on other pods. A failing prefill call cancels the decode call (which would otherwise wait for a
KV hand-off that never comes) and vice versa. Pods are chosen by routing.py on this gateway's
own pending work merged with the engines' reported load (engine_load.py).

Overload: before the first attempt the request's prefill group must admit it, and its class be
within its share of the decode pool (admission.py), or it gets 429 without reaching an engine.
An engine's error answer is judged by failures.py, which also decides whose failure it is (a
decode engine that waited in vain for its KV blames the prefill pod); health records count it
against that pod's pool, whose ejection is capped."""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from laps_agent.gateway.affinity import CacheAffinity
from laps_agent.gateway.config import GatewayConfig
from laps_agent.gateway.discovery.membership import Discovery, Membership
from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.prefix import PrefixChain, PrefixRecord
from laps_agent.gateway.proxy.engine_load import EngineLoadPoller, EngineLoads
from laps_agent.gateway.proxy.failures import GatewayError, Retryable, UpstreamStatus, judge_status
from laps_agent.gateway.proxy.load import DecodeHold, LoadTracker, PrefillTicket
from laps_agent.gateway.proxy.payload import PDPayload, upstream_headers
from laps_agent.gateway.proxy.relay import Leftovers
from laps_agent.gateway.proxy.replies import EventAligner, Reply, StreamReply, sse_error
from laps_agent.gateway.proxy.upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
    address,
)
from laps_agent.policy.admission import decode_held, decode_slots, group_load, in_time_route, refusal
from laps_agent.policy.allocation import offered_seconds
from laps_agent.policy.classes import SHORT, length_class
from laps_agent.policy.placement import ArrivalMix, place
from laps_agent.policy.routing import Endpoint, EndpointLoad, NoEndpointError, RouteDecision, choose_route

log = logging.getLogger(__name__)


@dataclass
class ProxyCall:
    path: str                 # upstream path, the same as the client's
    body: PDPayload           # the client's body, to which each attempt adds its PD fields
    stream: bool
    tokens: int               # estimated prompt tokens
    request_id: bytes         # to both pods as X-Request-ID (payload.upstream_headers)
    output_tokens: int = 0    # the answer tokens asked for (max_tokens; 0: not given)
    started: float = field(default_factory=time.monotonic)
    prefix: PrefixChain | None = None    # the prompt's block chain (cache affinity)
    engine_checked: bool = False         # an engine's answer said how much it found cached
    prefill_ended: float = 0.0           # the latest attempt's; the answering one's is the TTFT


class PDProxy:
    def __init__(self, config: GatewayConfig, discovery: Discovery, tracker: LoadTracker,
                 metrics: GatewayMetrics) -> None:
        self._config, self._discovery, self._tracker, self._metrics = config, discovery, tracker, metrics
        self._pool: UpstreamPool | None = None
        self._pool_membership: Membership | None = None   # what the pool last kept to
        # Rooms name a prompt's KV on the prefill engine: unpredictable (os.urandom), not only unique.
        self._rooms = random.SystemRandom()
        self._tiebreak = itertools.count()
        self._leftovers = Leftovers()
        self.engine_loads = EngineLoads(config.engine_load_interval_s)
        self._poller = EngineLoadPoller(self.engine_loads, discovery, tracker.loads,
                                        enabled=config.engine_load_poll, own_held=tracker.held_on)
        record = (PrefixRecord(config.prefix_record_blocks_per_pod, answers_warmed=config.prefix_warm)
                  if config.prefix_affinity else None)
        self.affinity = CacheAffinity(record, config.length_threshold, metrics)
        self.arrivals = ArrivalMix()   # the recent short share: how much placement protects the short group

    async def start(self) -> None:
        cfg = self._config.proxy
        self._pool = UpstreamPool(connect_timeout=cfg.connect_timeout_s,
                                  read_timeout=self._config.upstream_silence_s,
                                  max_idle_per_host=cfg.max_idle_connections_per_pod)
        await self._poller.start()

    async def aclose(self) -> None:
        await self._poller.stop()
        await self._leftovers.aclose()
        if self._pool is not None:
            await self._pool.aclose()

    def _follow_pool(self, membership: Membership) -> None:
        # Discovery replaces the membership object on every change: an unchanged one costs one
        # comparison. Pruned on the next request after a change: until then idle connections
        # to a pod that left stay, and a pod that leaves for a moment (an EndpointSlice being
        # replaced) loses its idle ones, the price of a new connection each.
        if membership is self._pool_membership or self._pool is None:
            return
        self._pool_membership = membership
        self._pool.keep_only({address(e.url) for e in membership.endpoints()})

    def route(self, tokens: int, exclude: set[str], membership: Membership,
              loads: Mapping[str, EndpointLoad], held=None) -> RouteDecision:
        return choose_route(tokens, self._config.length_threshold, membership.groups,
                            membership.decode, loads, exclude=frozenset(exclude),
                            tiebreak=next(self._tiebreak), held=held, bound=self._config.affinity_bound)

    def admit(self, d: RouteDecision, call: ProxyCall, membership: Membership,
              loads: Mapping[str, EndpointLoad]) -> RouteDecision:
        """Admission control (admission.refusal) of the group that would serve the request (its
        class's own, or the other one on fallback, which must not be swamped either), of the pod
        it goes to, and of the class's share of the decode pool: 429 when any is full. Returns
        the route: `d`, or `d` moved to a pod of its group that prefills it in time (in_time_route)."""
        cfg, members, capacity = self._config, membership.groups.get(d.group, ()), self.engine_loads.capacity
        d, pod = in_time_route(d, call.tokens, members, loads, capacity, cfg.max_pending_tokens_per_pod)
        message = refusal(d, group_load(members, loads, self._tracker.group_pending(d.group)[1]),
                          decode_held(membership.decode, loads, d.cls, self._tracker.decode_share_held(d.cls),
                                      self.engine_loads.others_held),
                          decode_slots(membership.decode, loads, self.engine_loads.slots),
                          cfg.max_pending_tokens_per_pod, cfg.max_decode_share, pod)
        if message is not None:
            self._metrics.rejected_of[d.cls].inc()
            raise GatewayError(429, "overloaded", message, cfg.retry_after_s)
        return d

    def place(self, call: ProxyCall, exclude: set[str], membership: Membership,
              loads: Mapping[str, EndpointLoad], held, admitted: bool) -> tuple[RouteDecision, float | None]:
        """The predicted-TTFT router (policy/placement.py): the route and when its prefill is
        predicted to end (the tracker's clock; None: not predicted in seconds), or 429 with the
        reason. `admitted`: a retry of an admitted request, placed without the admission bounds."""
        cfg = self._config
        placed = place(call.tokens, cfg.length_threshold, membership.groups, membership.decode, loads,
                       self.engine_loads.cost, held=held, exclude=frozenset(exclude), tiebreak=next(self._tiebreak),
                       max_pending_tokens_per_pod=0 if admitted else cfg.max_pending_tokens_per_pod,
                       capacity=self.engine_loads.capacity, batch_tokens=self.engine_loads.batch_tokens,
                       long_batch_tokens=self.engine_loads.long_batch_tokens,
                       decode_held=lambda cls: decode_held(membership.decode, loads, cls,
                                                           self._tracker.decode_share_held(cls),
                                                           self.engine_loads.others_held),
                       decode_slots=decode_slots(membership.decode, loads, self.engine_loads.slots),
                       max_decode_share=0.0 if admitted else cfg.max_decode_share,
                       protection=self.arrivals.protection, now=self._tracker.now(), ttft_slo_s=cfg.ttft_slo_s)
        if placed.route is None:
            cls = length_class(call.tokens, cfg.length_threshold)
            self._metrics.rejected_of[cls].inc()
            raise GatewayError(429, "overloaded", placed.refusal, cfg.retry_after_s)
        return placed.route, placed.prefill_end_at(self._tracker.now())

    async def forward(self, call: ProxyCall) -> Reply | StreamReply:
        exclude: set[str] = set()
        failure: GatewayError | None = None
        all_busy = True   # every attempt so far was refused, none failed (GatewayError.busy)
        held = self.affinity.held(call.prefix)
        cls = length_class(call.tokens, self._config.length_threshold)
        self._metrics.arrivals_of[cls].inc()   # demand, refused or not (the planner's input)
        self._metrics.arrival_tokens_of[cls, "prompt"].inc(call.tokens)
        self._metrics.arrival_tokens_of[cls, "output"].inc(call.output_tokens)
        self._tracker.arrived(cls, offered_seconds(call.tokens, self.engine_loads.fleet_cost()))
        for attempt in range(self._config.proxy.max_retries + 1):
            membership = self._discovery.membership()
            self.affinity.follow(membership)   # all three forget departed pods
            self._tracker.follow(membership)
            self._follow_pool(membership)
            # One view of the pods' loads (own + engine-reported) serves routing and admission.
            loads = self.engine_loads.merged(self._tracker.loads())
            prefill_end_at = None
            try:
                if self._config.router == "predicted":
                    if attempt == 0:
                        self.arrivals.observe(length_class(call.tokens, self._config.length_threshold) == SHORT)
                    decision, prefill_end_at = self.place(call, exclude, membership, loads, held, admitted=attempt > 0)
                else:
                    decision = self.route(call.tokens, exclude, membership, loads, held)
                    if attempt == 0:
                        decision = self.admit(decision, call, membership, loads)  # retries were admitted already
            except NoEndpointError as exc:
                message = f"no healthy pod can take this request ({exc})"
                if failure is not None:
                    message += f"; last failure: {failure.message}"
                raise GatewayError(503, "no_endpoint", message, self._config.retry_after_s, busy=all_busy) from None
            if attempt == 0:
                self._metrics.requests_of[decision.cls, decision.group].inc()
                self.affinity.routed(decision)
                if decision.fallback:
                    self._metrics.fallbacks_of[decision.cls].inc()
            else:
                self._metrics.retries.inc()
            try:
                return await self._attempt(call, decision, prefill_end_at)
            except Retryable as exc:
                exclude.update(exc.endpoints)
                failure = exc.error
                all_busy = all_busy and failure.busy
                log.log(logging.DEBUG if failure.busy else logging.WARNING, "request %s: attempt %d "
                        "failed: %s", call.request_id.decode(), attempt + 1, failure.message)
        failure.busy = all_busy   # a pod that failed before the last refusal still makes it a failure
        raise failure

    async def _attempt(self, call: ProxyCall, d: RouteDecision,
                       prefill_end_at: float | None = None) -> Reply | StreamReply:
        payload = call.body.pieces(d.prefill.bootstrap_host, d.prefill.bootstrap_port,
                                   self._rooms.getrandbits(63))
        ticket = self._tracker.begin_prefill(d.group, d.prefill.name, d.work(call.tokens), d.cls)
        self.affinity.sent(d, call.prefix)
        hold = self._tracker.begin_decode(d.decode.name, d.cls, prefill_end_at)
        headers = upstream_headers(d.cls, call.request_id)
        prefill = asyncio.create_task(self._prefill(d, call, payload, headers, ticket, hold))
        decode = asyncio.create_task(self._decode(d, call, payload, headers))
        handed_over = False
        try:
            done, _ = await asyncio.wait((prefill, decode), return_when=asyncio.FIRST_COMPLETED)
            if prefill in done and decode not in done:
                prefill.result()  # raises if the prefill pod failed: decode would wait forever
            result = await decode
            self._end_prefill_phase(call, ticket, hold)  # the decode pod's first byte says so
            self._metrics.ttft_of[d.cls].observe(call.prefill_ended - call.started)
            if isinstance(result, Reply):
                if not call.engine_checked:
                    call.engine_checked = self.affinity.engine_answer(d, result.body)
                self._metrics.request_seconds_of[d.cls].observe(time.monotonic() - call.started)
                self._tracker.end_decode(d.decode.name, hold)
                handed_over = True
                self._leftovers.let_finish(prefill)
                return result
            response, chunks, first = result
            handed_over = True
            return self._relay(call, d, prefill, response, chunks, first, hold)
        finally:
            if not handed_over:
                prefill.cancel()
                decode.cancel()
                ticket.done()
                self._tracker.end_decode(d.decode.name, hold)
                # Retrieve outcomes so a task failing after its sibling is never "unretrieved".
                await asyncio.gather(prefill, decode, return_exceptions=True)

    def _end_prefill_phase(self, call: ProxyCall, ticket: PrefillTicket, hold: DecodeHold) -> None:
        if ticket.done():  # only the first of the two signals counts
            call.prefill_ended = time.monotonic()
            self._tracker.hand_off(hold)

    async def _prefill(self, d: RouteDecision, call: ProxyCall, payload: tuple[memoryview, bytes],
                       headers: bytes, ticket: PrefillTicket, hold: DecodeHold) -> None:
        pod = d.prefill
        try:
            response = await self._pool.post(*address(pod.url), call.path, payload, headers)
            body = await response.read()
        except UpstreamError as exc:
            raise self._transport_failure(d, "prefill", exc) from None
        if response.status >= 300:
            raise self._status_failure(d, "prefill", response.status, body)
        self._tracker.record_success(pod.name)
        if not call.engine_checked:
            call.engine_checked = self.affinity.engine_answer(d, body)
        self._end_prefill_phase(call, ticket, hold)

    async def _decode(self, d: RouteDecision, call: ProxyCall, payload: tuple[memoryview, bytes],
                      headers: bytes):
        pod = d.decode
        response: UpstreamResponse | None = None
        try:
            response = await self._pool.post(*address(pod.url), call.path, payload, headers)
            if response.status != 200 or not call.stream:
                body = await response.read()
                if response.status >= 300:
                    raise self._status_failure(d, "decode", response.status, body)
                self._tracker.record_success(pod.name)
                return Reply(response.status, body,
                             response.headers.get(b"content-type", b"application/json").decode())
            chunks = response.chunks()
            first = await anext(chunks, b"")
        except UpstreamError as exc:
            raise self._transport_failure(d, "decode", exc) from None
        finally:
            if response is not None and (not call.stream or response.status != 200):
                response.release()
        self._tracker.record_success(pod.name)
        return response, chunks, first

    def _record_failure(self, d: RouteDecision, role: str) -> Endpoint:
        """Count a failure against the request's `role` pod, within its pool (ejection cap)."""
        membership = self._discovery.membership()
        if role == "prefill":
            pod, pool, members = d.prefill, d.group, membership.groups.get(d.group, ())
        else:
            pod, pool, members = d.decode, "decode", membership.decode
        self._tracker.record_failure(pod.name, pool, [e.name for e in members])
        return pod

    def _transport_failure(self, d: RouteDecision, role: str, exc: UpstreamError) -> Exception:
        pod = self._record_failure(d, role)
        detail = f"{role} pod {pod.name}: {exc}"
        if isinstance(exc, UpstreamTimeout):
            return GatewayError(504, "upstream_timeout", f"timed out waiting for {detail}")
        # Nothing reached the client yet, so even a response broken midway can be retried.
        kind = "upstream_connection" if isinstance(exc, UpstreamConnectError) else "upstream_broken"
        return Retryable((pod.name,), GatewayError(502, kind, detail))

    def _status_failure(self, d: RouteDecision, role: str, status: int, body: bytes) -> Exception:
        blame = judge_status(role, status, body, prefill=d.prefill.name, group=d.group,
                             decode=d.decode.name)
        if blame is None:
            # The engine's own verdict on the request (e.g. prompt too long): the client's to see.
            pod = d.prefill if role == "prefill" else d.decode
            return UpstreamStatus(status, body, f"{role} pod {pod.name}")
        if blame.state == "failing":
            pod = self._record_failure(d, blame.role)
        else:  # draining or busy: refused, not failed (failures.py)
            pod, pool = (d.prefill, d.group) if blame.role == "prefill" else (d.decode, "decode")
            if blame.state == "draining":
                self._tracker.record_draining(pod.name, pool)
        error = GatewayError(blame.status, blame.reason, blame.message, self._config.retry_after_s
                             if blame.status == 503 else None, no_retry=not blame.retry,
                             busy=blame.state != "failing")
        return Retryable((pod.name,), error) if blame.retry else error

    def _relay(self, call: ProxyCall, d: RouteDecision, prefill: asyncio.Task,
               response: UpstreamResponse, chunks: AsyncIterator[bytes], first: bytes,
               hold: DecodeHold) -> StreamReply:
        closed = False

        async def close() -> None:
            nonlocal closed
            if closed:
                return
            closed = True
            self._tracker.end_decode(d.decode.name, hold)
            self._metrics.request_seconds_of[d.cls].observe(time.monotonic() - call.started)
            self._leftovers.let_finish(prefill)
            await chunks.aclose()  # releases (or closes, if unfinished) the connection

        async def relay() -> AsyncIterator[bytes]:
            # Whole events only, so an error event of ours (below, or the deadline's) never
            # lands in the middle of one.
            events = EventAligner()
            try:
                if first and (whole := events.feed(first)):
                    yield whole
                async for chunk in chunks:
                    if whole := events.feed(chunk):
                        yield whole
                if rest := events.rest():
                    yield rest
            except UpstreamError as exc:
                # Bytes already reached the client: no retry possible, so end with a clear event.
                self._record_failure(d, "decode")
                self._metrics.errors.labels("upstream_broken").inc()
                log.warning("request %s: decode pod %s broke off the stream (%s)",
                            call.request_id.decode(), d.decode.name, exc)
                yield sse_error(f"decode pod {d.decode.name} broke off the stream: "
                                f"{type(exc).__name__}")
            finally:
                await close()

        return StreamReply(relay(), close)
