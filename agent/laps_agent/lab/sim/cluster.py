"""A simulated PD cluster: the gateway's routing and load accounting in front of engine models.

Discrete events on a virtual clock. What runs is the product's own code: `choose_route` and the
gateway's `LoadTracker` pick the prefill and decode pod of every request exactly as the gateway
does (with cache affinity for systems that have it: prefix.py; `sglang-cache-aware` routes by
SGLang's cache_aware rule instead, policy/cache_aware.py, over its own prefix trees); every engine is an
`EngineModel` (the emulated engine's model: the real `PrefillScheduler`, batch and step times
from the profile, a prefix cache on each prefill engine). A request's path mirrors the emulated engines':

  arrival -> route (pending work booked on the prefill pod) -> prefill queue and batch
  -> hand-off (profile.transfer_seconds; the gateway's prefill phase ends when it is collected)
  -> decode engine admits it at its next iteration (first token = TTFT) -> decode steps -> done
  -> (systems with prefix warming, a conversation's turn) one hop later its prefill engine is
     sent prompt + answer to compute when idle (engine/pd/prefix_warm.py).

Admission is the gateway's, decode share included (each class's requests counted as the
gateway's LoadTracker counts them; the share `laps local` runs the system with: none for one
pool or without admission control); network hops
take `hop_s` each (default 1 ms); client think time and failures are not modelled. What the
simulator models, and how far it agrees with the emulated cluster: docs/design/simulator.md.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from laps_agent.emulated.core import EngineModel, Event, ModelRequest
from laps_agent.emulated.prefill_cost import calibrate
from laps_agent.emulated.profile import Profile
from laps_agent.engine.core.load_report import in_time_tokens
from laps_agent.engine.flags import bucket_grid, build_parser, decode_order, scheduler_config, slo_args
from laps_agent.gateway.config import ProxyConfig
from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.proxy.load import DecodeHold, LoadTracker
from laps_agent.lab.results.records import TimelineSample
from laps_agent.lab.sim.allocation import INTERVAL_S, SimAllocator, runs_loop, timeline_sample
from laps_agent.lab.sim.autoscale import Scaling, SimFleet, SimScaler, pod_costs
from laps_agent.lab.sim.prefix import SimPrefixes
from laps_agent.policy.admission import DEFAULT_MAX_PENDING_TOKENS_PER_POD, gateway_decode_share, in_time_route, refusal
from laps_agent.policy.allocation import AllocationConfig, fleet_cost, offered_seconds
from laps_agent.policy.cache_aware import cache_aware_choice
from laps_agent.policy.classes import DEFAULT_LENGTH_THRESHOLD, LONG, SHORT, length_class
from laps_agent.policy.groups import initial_short_count
from laps_agent.policy.placement import ArrivalMix, PrefillCost, place
from laps_agent.policy.planner import Pools, join_group, keep_both_groups
from laps_agent.policy.routing import Endpoint, NoEndpointError, RouteDecision, choose_route
from laps_agent.policy.slo import ttft_slos
from laps_agent.policy.systems import SINGLE_POOL_THRESHOLD, SystemConfig

_ARRIVE, _ENGINE, _KV, _SAMPLE, _REBALANCE, _WARM, _SCALE = 0, 1, 2, 3, 4, 5, 6
HOP_S = 0.001


@dataclass
class SimRequest:
    index: int
    prompt_tokens: int
    output_tokens: int
    routed_tokens: int            # what the gateway's estimator counted
    sent: float
    cls: str = ""
    prefill: int = -1
    decode: int = -1
    ticket: object = None
    first: float | None = None
    done: float | None = None
    status: int = 0
    error: str | None = None
    conversation: int = -1
    cached: int = -1              # prompt tokens its prefill engine found cached (-1: never got there)
    expected: int = 0             # what the gateway expected it to find
    hold: DecodeHold | None = None   # its place in its class's decode share, as the gateway books it
    tokens: int = 0               # completion tokens its decode engine gave (capped by the context)


@dataclass
class SimOutcome:
    requests: list[SimRequest]
    timeline: list[TimelineSample] = field(default_factory=list)
    # Until the last request ended (answered or refused), from time 0 of the arrival times, as
    # `laps bench run` times a run; the samples, allocation ticks and warms after it do not count.
    duration: float = 0.0
    prefill_busy: list[float] = field(default_factory=list)   # modelled busy seconds per pod
    prefill_warm: list[float] = field(default_factory=list)   # of which prefix warms
    decode_busy: list[float] = field(default_factory=list)
    fleet: SimFleet | None = None      # a sized run's pods over time (autoscale.py)
    scaler: SimScaler | None = None


class SimCluster:
    def __init__(self, profile: Profile, system: SystemConfig, *, prefill: int, decode: int,
                 threshold: int = DEFAULT_LENGTH_THRESHOLD, engine_args: Sequence[str] = (),
                 estimate: Callable[[int], int] | None = None, sample_every_s: float = 1.0,
                 short_pods: int | None = None, allocation: AllocationConfig | None = None,
                 interval_s: float = INTERVAL_S, hop_s: float = HOP_S,
                 max_pending_tokens_per_pod: int | None = None, prefix_cache_tokens: int | None = None,
                 oracle: bool = False, scaling: Scaling | None = None,
                 ttft_slo_s: Mapping[str, float] | None = None) -> None:
        if prefill < 1 or decode < 1:
            raise ValueError("a cluster needs at least one prefill and one decode engine")
        # The engine's own flag parser turns the system's knobs into the scheduler settings, so
        # the simulated engines are configured exactly as `laps local` configures real ones.
        flags = [*system.engine_args(), "--length-threshold", str(threshold), *engine_args]
        args = build_parser().parse_args([*flags, *slo_args(flags, ttft_slos(ttft_slo_s))])
        grid = bucket_grid(args)
        sched = scheduler_config(args, grid, args.max_prefill_tokens or profile.engine.max_prefill_tokens)
        order = decode_order(args)
        running = args.max_running_requests or profile.engine.max_running_requests
        self.batch_tokens = sched.max_prefill_tokens
        self.decode_slots_per_pod = running   # what each decode engine reports as its slots
        self.max_decode_share = gateway_decode_share(not system.groups, system.max_decode_share)
        self.long_batch_tokens = sched.max_long_batch_tokens

        # A sized cluster has an engine for every pod it may run (autoscale.py: the fleet says
        # which exist); `prefill` and `decode` are the pods serving from the start.
        all_prefill = max(prefill, scaling.config.max_prefill) if scaling else prefill
        all_decode = max(decode, scaling.config.max_decode) if scaling else decode
        # Prefix caches (None: the profile's KV capacity; 0: none) and the gateway's record;
        # `oracle`: one unlimited cache all pods share, known to the router (prefix.py).
        self.prefixes = SimPrefixes(profile, all_prefill, affinity=system.affinity, cache_tokens=prefix_cache_tokens,
                                    oracle=oracle, tree=system.router == "cache_aware")
        # cache_aware's tree sizes: prompt tokens sent to each pod that its tree did not match
        # (every prompt's text goes into the router's tree, a conversation's or not).
        self.tree_tokens = [0] * all_prefill

        def model(role: str, cache=None) -> EngineModel:
            engine = EngineModel(profile, role, sched, grid, batch_prefill_graphs_mode=args.batch_prefill_graphs_mode,
                                 max_running=running, kv_pages=args.kv_pages, context_len=args.context_length,
                                 token_events=False, prefix_cache=cache, decode_order=order)
            calibrate(engine)   # as `laps engine` at start-up
            return engine

        self.profile, self.system = profile, system
        self.prefill = [model("prefill", self.prefixes.caches[i]) for i in range(all_prefill)]
        self.decode = [model("decode") for _ in range(all_decode)]
        self.prefill_eps = [Endpoint(f"prefill-{i}", f"sim://prefill-{i}", f"prefill-{i}", 0)
                            for i in range(all_prefill)]
        self._decode_all = [Endpoint(f"decode-{i}", f"sim://decode-{i}", f"decode-{i}", 0) for i in range(all_decode)]
        self.decode_eps = tuple(self._decode_all[:decode])   # those routed to
        self._prefill_index = {ep.name: i for i, ep in enumerate(self.prefill_eps)}
        self._decode_index = {ep.name: i for i, ep in enumerate(self._decode_all)}
        if system.groups:
            short = short_pods if short_pods is not None else initial_short_count(prefill)
            if not 1 <= short <= prefill:
                raise ValueError(f"short_pods must be in 1..{prefill}, got {short}")
            self.groups = {"short": tuple(self.prefill_eps[:short]), "long": tuple(self.prefill_eps[short:prefill])}
            self.threshold = threshold
        else:
            self.groups = {"short": tuple(self.prefill_eps[:prefill]), "long": ()}
            # One pool: no classes when routed least-loaded (vanilla PD); routed by prediction,
            # the classes still say what each engine's dual queue serves first.
            self.threshold = threshold if system.router == "predicted" else SINGLE_POOL_THRESHOLD
        self.class_threshold = threshold
        self.now = 0.0   # the virtual clock, the gateway's (its load tracker's) too
        self.tracker = LoadTracker(GatewayMetrics(), ProxyConfig(), clock=lambda: self.now)
        self.arrivals = ArrivalMix()
        self.estimate = estimate or (lambda tokens: tokens)
        self.sample_every_s = sample_every_s
        self.allocation = allocation or AllocationConfig()
        self.interval_s, self.hop_s = interval_s, hop_s
        bound = system.max_pending_tokens_per_pod if max_pending_tokens_per_pod is None else max_pending_tokens_per_pod
        self.max_pending_tokens_per_pod = DEFAULT_MAX_PENDING_TOKENS_PER_POD if bound is None else bound
        self.ttft_slo_s = ttft_slos(ttft_slo_s)   # the gateway's --slo (a `short=`/`long=`/`all=` mapping)
        self.bootstrap_timeout_s = args.bootstrap_timeout   # what the engines report their figure by
        # What `laps local`'s StaticAllocator does, on the virtual clock (allocation.py).
        self.allocator = SimAllocator(system.allocation, self.allocation, self.prefill_eps)
        self.moves = self.allocator.moves  # (time, move) of every pod moved between groups
        self._seq = itertools.count()
        self._tiebreak = itertools.count()
        self.scaling = scaling
        self.fleet = self.scaler = None
        if scaling is not None:
            self.fleet = SimFleet({"prefill": [ep.name for ep in self.prefill_eps],
                                   "decode": [ep.name for ep in self._decode_all]}, Pools(prefill, decode), scaling.config)
            self.scaler = SimScaler(scaling, self.fleet)

    # ---- the run -------------------------------------------------------------------------------
    def run(self, at: Sequence[float], prompt_tokens: Sequence[int], output_tokens: Sequence[int],
            conversation: Sequence[int] | None = None) -> SimOutcome:
        """Simulate requests arriving at times `at` (sorted, seconds) until every one finished;
        `conversation`: each request's conversation id (-1: none), whose turns share prefixes."""
        n = len(at)
        reqs = [SimRequest(i, int(prompt_tokens[i]), int(output_tokens[i]),
                           self.estimate(int(prompt_tokens[i])), float(at[i]),
                           conversation=-1 if conversation is None else int(conversation[i])) for i in range(n)]
        for r in reqs:
            r.cls = length_class(r.prompt_tokens, self.class_threshold)
        heap: list = []
        self._heap, self._reqs = heap, reqs
        self._scheduled: dict[int, float | None] = {}
        self._engines = self.prefill + self.decode
        timeline: list[TimelineSample] = []
        allocating = runs_loop(self.system)
        if n and (self.sample_every_s > 0 or allocating or self.scaler):
            heapq.heappush(heap, (float(at[0]), next(self._seq), _SAMPLE, None))
        if n and allocating:
            heapq.heappush(heap, (float(at[0]) + self.interval_s, next(self._seq), _REBALANCE, None))
        if n and self.scaler:
            heapq.heappush(heap, (float(at[0]) + self.scaling.config.interval_s, next(self._seq), _SCALE, None))
        nxt, now = 0, 0.0
        self._finished, self._last_end = 0, 0.0
        while nxt < n or heap:
            if nxt < n and (not heap or at[nxt] <= heap[0][0]):
                now = self.now = reqs[nxt].sent
                self._route(reqs[nxt], now)
                nxt += 1
                continue
            now, _, kind, payload = heapq.heappop(heap)
            self.now = now
            if kind == _ARRIVE:
                self._arrive(reqs[payload], now)
            elif kind == _ENGINE:
                if self._scheduled.get(payload) != now:
                    continue  # superseded
                self._scheduled[payload] = None
                self._poll(payload, now)
            elif kind == _WARM:
                self._warm(reqs[payload], now)
            elif kind == _KV:
                self._kv_arrived(reqs[payload], now)
            elif kind == _SAMPLE:  # the timeline, and the allocation's pressure samples (1 s)
                timeline.append(timeline_sample(now, self.groups, self.tracker))
                self.allocator.observe(self.tracker)
                if self.fleet is not None:
                    self._fleet_tick(now)
                if self._finished < n:
                    heapq.heappush(heap, (now + (self.sample_every_s or 1.0), next(self._seq), _SAMPLE, None))
            elif kind == _REBALANCE:
                self.groups = self.allocator.rebalance(now, self.groups, self.tracker)
                if self._finished < n:
                    heapq.heappush(heap, (now + self.interval_s, next(self._seq), _REBALANCE, None))
            elif kind == _SCALE:
                self._scale(now)
                if self._finished < n:
                    heapq.heappush(heap, (now + self.scaling.config.interval_s, next(self._seq), _SCALE, None))
        if self.fleet is not None:
            self.fleet.advance(self._last_end)
        return SimOutcome(reqs, timeline, self._last_end,
                          prefill_busy=[e.busy_seconds for e in self.prefill],
                          decode_busy=[e.busy_seconds for e in self.decode],
                          prefill_warm=[e.warm_seconds for e in self.prefill], fleet=self.fleet, scaler=self.scaler)

    # ---- sizing (autoscale.py) -----------------------------------------------------------------
    def _scale(self, now: float) -> None:
        """One scaler decision: pods ordered, or taken out of routing to drain."""
        serving_decode = [self.decode[self._decode_index[n]] for n in self.fleet.serving("decode")]
        busy = {"prefill": sum(e.busy_seconds for e in self.prefill), "decode": sum(e.busy_seconds for e in self.decode)}
        serving_prefill = [ep.name for eps in self.groups.values() for ep in eps]
        costs = pod_costs(self.prefill[self._prefill_index[serving_prefill[0]]], self.profile) if serving_prefill else None
        loads = self.tracker.loads()
        prefill_loads = [loads[ep.name] for ep in self.prefill_eps if ep.name in loads]
        short = sum(x.short_requests for x in prefill_loads)
        waiting = {SHORT: float(short), LONG: float(sum(x.pending_requests for x in prefill_loads) - short)}
        decode_held = sum(len(e.running) + len(e.imports) for e in serving_decode)
        pools = self.scaler.decide(now, costs, float(decode_held), waiting, busy)
        if pools is None:
            return

        def in_flight(name: str) -> float:
            load = loads.get(name)
            return float(load.pending_requests) if load else 0.0

        for name in self.fleet.resize("prefill", pools.prefill, now, in_flight):
            self.groups = {g: tuple(ep for ep in eps if ep.name != name) for g, eps in self.groups.items()}
        if self.system.groups:
            self.groups = keep_both_groups(self.groups)
        gone = set(self.fleet.resize("decode", pools.decode, now, in_flight))
        self.decode_eps = tuple(ep for ep in self.decode_eps if ep.name not in gone)

    def _fleet_tick(self, now: float) -> None:
        loads = self.tracker.loads()

        def idle(pool: str, name: str) -> bool:
            load = loads.get(name)
            engine = (self.prefill[self._prefill_index[name]] if pool == "prefill"
                      else self.decode[self._decode_index[name]])
            return not engine.requests and (load is None or load.pending_requests == 0)

        for pool, name in self.fleet.tick(now, idle):
            if pool == "decode":
                self.decode_eps = (*self.decode_eps, self._decode_all[self._decode_index[name]])
                continue
            ep = self.prefill_eps[self._prefill_index[name]]
            group = join_group(self.groups, self.scaler.short_target) if self.system.groups else SHORT
            self.groups = {**self.groups, group: (*self.groups[group], ep)}

    def _route(self, r: SimRequest, now: float) -> None:
        """The gateway (one hop from the client) routes; the engines get it one hop later."""
        loads = self.tracker.loads()
        cost = fleet_cost(self._cost(ep.name) for ep in self.prefill_eps)   # as the gateway counts it
        self.tracker.arrived(length_class(r.routed_tokens, self.class_threshold), offered_seconds(r.routed_tokens, cost))
        if self.scaler is not None:   # demand as the gateway counts it, refused requests too
            self.scaler.arrived(length_class(r.routed_tokens, self.class_threshold), r.routed_tokens,
                                r.prompt_tokens, r.output_tokens)
        if self.system.router == "predicted":
            self._place(r, now, loads)
            return
        try:
            if self.system.router == "cache_aware":
                d = self._cache_aware_route(r, loads)
            else:
                d = choose_route(r.routed_tokens, self.threshold, self.groups, self.decode_eps, loads,
                                 tiebreak=next(self._tiebreak),
                                 held=self.prefixes.held(r.conversation, r.prompt_tokens))
        except NoEndpointError as exc:
            self._fail(r, now, 503, str(exc))
            return
        bound = self.max_pending_tokens_per_pod
        d, pod = in_time_route(d, r.routed_tokens, self.groups[d.group], loads, self._capacity, bound)
        why = refusal(d, (len(self.groups[d.group]), self.tracker.group_pending(d.group)[1]),
                      self.tracker.decode_share_held(d.cls), self._decode_slots(), bound, self.max_decode_share, pod)
        if why is not None:   # refused before any engine
            self._fail(r, now, 429, why)
            return
        self._dispatch(r, now, d)

    def _place(self, r: SimRequest, now: float, loads: dict) -> None:
        """The predicted-TTFT router (policy/placement.py): one call routes or refuses."""
        self.arrivals.observe(length_class(r.routed_tokens, self.class_threshold) == SHORT)
        try:
            placed = place(r.routed_tokens, self.threshold, self.groups, self.decode_eps, loads, self._cost,
                           held=self.prefixes.held(r.conversation, r.prompt_tokens), tiebreak=next(self._tiebreak),
                           batch_tokens=lambda name: self.batch_tokens,
                           long_batch_tokens=lambda name: self.long_batch_tokens, max_pending_tokens_per_pod=self.max_pending_tokens_per_pod,
                           capacity=self._capacity, protection=self.arrivals.protection, now=now,
                           ttft_slo_s=self.ttft_slo_s, decode_held=self.tracker.decode_share_held,
                           decode_slots=self._decode_slots(), max_decode_share=self.max_decode_share)
        except NoEndpointError as exc:
            self._fail(r, now, 503, str(exc))
            return
        if placed.route is None:
            self._fail(r, now, 429, placed.refusal)
            return
        self._dispatch(r, now, placed.route, placed.prefill_end_at(now))

    def _decode_slots(self) -> int:
        """The decode pool's slots, as the gateway sums its serving decode pods' reports."""
        return self.decode_slots_per_pod * len(self.decode_eps)

    def _cost(self, name: str) -> PrefillCost | None:
        cost = self.prefill[self._prefill_index[name]].scheduler.prefill_cost()
        return None if cost is None else PrefillCost(*cost)

    def _dispatch(self, r: SimRequest, now: float, d: RouteDecision, prefill_end_at: float | None = None) -> None:
        r.prefill, r.decode = self._prefill_index[d.prefill.name], self._decode_index[d.decode.name]
        r.expected = d.cached  # the pod's work is what it is not expected to hold, as the gateway books it
        r.ticket = self.tracker.begin_prefill(d.group, d.prefill.name, d.work(r.routed_tokens), d.cls)
        r.hold = self.tracker.begin_decode(d.decode.name, d.cls, prefill_end_at)
        self.prefixes.sent(d.prefill.name, r.conversation, r.prompt_tokens)  # as the gateway records
        if self.hop_s > 0:
            heapq.heappush(self._heap, (now + 2 * self.hop_s, next(self._seq), _ARRIVE, r.index))
        else:
            self._arrive(r, now)

    def _cache_aware_route(self, r: SimRequest, loads: dict) -> RouteDecision:
        """SGLang's router, cache_aware (policy/cache_aware.py) for the prefill pod, the least
        loaded decode pod (choose_route over that one pod, so decode is chosen as for every system)."""
        choice = cache_aware_choice(r.routed_tokens, [ep for eps in self.groups.values() for ep in eps], loads,
                                    self.prefixes.matched(r.conversation, r.prompt_tokens),
                                    lambda ep: self.tree_tokens[self._prefill_index[ep.name]])
        if choice is None:
            raise NoEndpointError(f"no usable prefill pod for a request ({r.routed_tokens} tokens)")
        d = choose_route(r.routed_tokens, SINGLE_POOL_THRESHOLD, {SHORT: (choice.endpoint,), LONG: ()},
                         self.decode_eps, loads, tiebreak=next(self._tiebreak))
        cached = min(choice.matched, max(0, r.routed_tokens - 1))
        self.tree_tokens[self._prefill_index[choice.endpoint.name]] += r.routed_tokens - cached
        return dataclasses.replace(d, cached=cached)

    def _capacity(self, name: str) -> int | None:
        """What prefill pod `name` reports it prefills in time (engine/load_report.py), always
        fresh (the gateway's view is up to one load poll old)."""
        cost = self.prefill[self._prefill_index[name]].scheduler.prefill_cost()
        return in_time_tokens("prefill", cost, self.bootstrap_timeout_s)

    def _arrive(self, r: SimRequest, now: float) -> None:
        engine = self.prefill[r.prefill]
        req = ModelRequest(r.index, "prefill", r.prompt_tokens, r.output_tokens, now,
                           blocks=self.prefixes.blocks(r.conversation, r.prompt_tokens))
        errors = engine.add(req, now)
        if errors:
            self._fail(r, now, 400, errors[0].error)
            return
        r.cached = req.cached_tokens
        self._poll(r.prefill, now)

    def _warm(self, r: SimRequest, now: float) -> None:
        """Prefix warming (engine/prefix_warm.py): the prefill engine that served the turn
        computes prompt + answer when idle. The gateway's record counts the answer as held
        from now (the real gateway infers it at the next turn: gateway/prefix.py)."""
        total = r.prompt_tokens + r.tokens  # the answer it got, as the decode engine sends it
        self.prefixes.sent(self.prefill_eps[r.prefill].name, r.conversation, total)
        self.prefill[r.prefill].warm(self.prefixes.blocks(r.conversation, total), total)
        self._poll(r.prefill, now)

    def _kv_arrived(self, r: SimRequest, now: float) -> None:
        r.ticket.done()  # the prefill engine's answer ends once the decode engine has the KV
        self.tracker.hand_off(r.hold)
        engine = self.decode[r.decode]
        errors = engine.add(ModelRequest(r.index, "decode", r.prompt_tokens, r.output_tokens, r.sent,
                                         cls=r.cls), now)
        if errors:
            self._fail(r, now, 400, errors[0].error)
            return
        self._poll(len(self.prefill) + r.decode, now)

    def _poll(self, engine_id: int, now: float) -> None:
        engine = self._engines[engine_id]
        events = engine.poll(now)
        if events:
            self._handle(engine_id, events)
        due = engine.next_time()
        if due is not None and self._scheduled.get(engine_id) != due:
            self._scheduled[engine_id] = due
            heapq.heappush(self._heap, (due, next(self._seq), _ENGINE, engine_id))

    def _handle(self, engine_id: int, events: list[Event]) -> None:
        reqs = self._reqs
        prefill_side = engine_id < len(self.prefill)
        for ev in events:
            r = reqs[ev.rid]
            if ev.kind == "error":
                self._fail(r, ev.time, 400, ev.error)
            elif prefill_side:  # "prefilled": the KV travels to the decode engine
                t = ev.time + self.profile.transfer_seconds(r.prompt_tokens) + self.hop_s
                heapq.heappush(self._heap, (t, next(self._seq), _KV, r.index))
            else:
                if ev.tokens == 1 or r.first is None:
                    r.first = ev.time + 2 * self.hop_s  # decode engine -> gateway -> client
                if ev.finished:
                    r.done, r.status, r.tokens = ev.time + 2 * self.hop_s, 200, ev.tokens
                    self._last_end = max(self._last_end, r.done)
                    self.tracker.end_decode(self._decode_all[r.decode].name, r.hold)
                    self._finished += 1
                    if self.system.prefix_warm and r.conversation >= 0:  # decode engine -> prefill engine
                        heapq.heappush(self._heap, (ev.time + self.hop_s, next(self._seq), _WARM, r.index))

    def _fail(self, r: SimRequest, now: float, status: int, message: str | None) -> None:
        r.status, r.error, r.done = status, message, now
        self._last_end = max(self._last_end, now)
        if r.ticket is not None:
            r.ticket.done()
        if r.decode >= 0:
            self.tracker.end_decode(self._decode_all[r.decode].name, r.hold)
        self._finished += 1


def chars4_estimate(chars_per_token: float) -> Callable[[int], int]:
    """The reference's chars/4 estimate of a prompt of n tokens of text with this many characters
    per token (the load generator's filler text; what the real gateway would count)."""
    return lambda tokens: max(1, math.floor(tokens * chars_per_token) // 4)
