"""Prometheus series of the gateway (`laps_gateway_*`, names fixed by docs/contracts.md).

Each gateway owns its registry, so several gateways in one process (tests, benchmarks) never
share counters."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from laps_agent.policy.classes import CLASSES
from laps_agent.serving.metric_buckets import LATENCY_BUCKETS

POOLS = (*CLASSES, "decode")   # what outlier ejection is capped per: the prefill groups, the decode pool


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.pending_requests = Gauge(
            "laps_gateway_pending_requests", "Requests of the group's class (whichever pod serves "
            "them) whose prefill phase has not completed yet", ["group"], registry=r)
        self.pending_tokens = Gauge(
            "laps_gateway_pending_tokens", "Estimated prompt tokens of the pending requests",
            ["group"], registry=r)
        self.requests = Counter(
            "laps_gateway_requests", "Requests routed, by length class and prefill group",
            ["class", "group"], registry=r)
        # Demand, as the planner sizes the pools from it: every request that arrived (routed or
        # refused), its estimated prompt tokens and the answer tokens it asked for (max_tokens).
        self.arrivals = Counter(
            "laps_gateway_arrivals", "Requests that arrived, routed or refused, by length class", ["class"],
            registry=r)
        self.arrival_tokens = Counter(
            "laps_gateway_arrival_tokens", "Tokens of the requests that arrived, by length class: kind=prompt "
            "(the estimated prompt), kind=output (the max_tokens asked for, where given)", ["class", "kind"],
            registry=r)
        # The allocation loop's pressure: its rate per class (policy/allocation.py).
        self.offered_prefill = Counter(
            "laps_gateway_offered_prefill_seconds", "Prefill seconds that every request that arrived needs, "
            "by length class, each predicted at the prefill pods' measured cost (their mean)",
            ["class"], registry=r)
        self.fallbacks = Counter(
            "laps_gateway_fallbacks", "Requests served by a pod of the other group (the router "
            "predicted it faster, or their own had no usable pod)", ["class"], registry=r)
        self.retries = Counter(
            "laps_gateway_retries", "Attempts repeated on other pods after a connection failure",
            registry=r)
        self.rejected = Counter(
            "laps_gateway_rejected", "Requests refused by admission control (429): the prefill "
            "group that would serve them was over its pending-token bound "
            "(--max-pending-tokens-per-pod), no pod of it would prefill them within what it "
            "reports it prefills in time, or their class held its share of the decode slots "
            "(--max-decode-share)", ["class"], registry=r)
        self.ejections = Counter(
            "laps_gateway_ejections", "Pods taken out of routing by passive health checks "
            "(outcome=ejected), or kept in because the ejection cap of their pool forbade it "
            "(outcome=capped), or taken out because they answered that they are draining "
            "(outcome=draining)", ["pool", "outcome"], registry=r)
        self.errors = Counter(
            "laps_gateway_errors", "Requests answered with an error, by reason", ["reason"],
            registry=r)
        self.ttft = Histogram(
            "laps_gateway_ttft_seconds", "Arrival to the end of the prefill phase (first token) "
            "of the attempt that answered: one sample per answered request",
            ["class"], buckets=LATENCY_BUCKETS, registry=r)
        self.rebalances = Counter(
            "laps_gateway_rebalances", "Prefill pods moved between groups by this gateway's own "
            "allocation loop (laps local; on Kubernetes the operator moves pods)", ["direction"],
            registry=r)
        self.request_seconds = Histogram(
            "laps_gateway_request_seconds", "Arrival to the last byte of the answer",
            ["class"], buckets=LATENCY_BUCKETS, registry=r)
        # Never labelled by key: a key in a label would publish it.
        self.auth_failures = Counter(
            "laps_gateway_auth_failures", "Requests refused 401 for a missing or invalid API key",
            ["reason"], registry=r)
        self.rate_limited = Counter(
            "laps_gateway_rate_limited", "Requests refused 429 because their API key was over "
            "its request rate (--rate-limit-per-key)", registry=r)
        # Cache affinity and expected uncached length (gateway/affinity.py).
        self.affinity = Counter(
            "laps_gateway_affinity_routes", "Requests routed to a prefill pod expected to hold a "
            "prefix of their prompt (outcome=hit) or to none (outcome=miss)", ["outcome"], registry=r)
        self.expected_cached_tokens = Counter(
            "laps_gateway_expected_cached_tokens", "Prompt tokens the chosen prefill pods were "
            "expected to hold (the gateway's record of what it sent where)", registry=r)
        self.class_checks = Counter(
            "laps_gateway_class_checks", "Requests whose engine answer reported its cached tokens, "
            "by the gateway's class and the class of the uncached tokens the engine saw",
            ["gateway_class", "engine_class"], registry=r)
        self.class_disagreements = Counter(
            "laps_gateway_class_disagreements", "Of those, the ones whose gateway class differs "
            "from the engine's", ["gateway_class", "engine_class"], registry=r)
        for reason in ("missing", "invalid"):
            self.auth_failures.labels(reason)
        # Children made once: labels() costs a lock and a dict lookup on every request. Making
        # them also exports zeros from the start, so dashboards see every series.
        self.pending_requests_of = {g: self.pending_requests.labels(g) for g in CLASSES}
        self.pending_tokens_of = {g: self.pending_tokens.labels(g) for g in CLASSES}
        self.requests_of = {(c, g): self.requests.labels(c, g) for c in CLASSES for g in CLASSES}
        self.fallbacks_of = {c: self.fallbacks.labels(c) for c in CLASSES}
        self.arrivals_of = {c: self.arrivals.labels(c) for c in CLASSES}
        self.offered_prefill_of = {c: self.offered_prefill.labels(c) for c in CLASSES}
        self.arrival_tokens_of = {(c, k): self.arrival_tokens.labels(c, k) for c in CLASSES for k in ("prompt", "output")}
        self.rejected_of = {c: self.rejected.labels(c) for c in CLASSES}
        for pool in POOLS:
            for outcome in ("ejected", "capped", "draining"):
                self.ejections.labels(pool, outcome)
        self.ttft_of = {c: self.ttft.labels(c) for c in CLASSES}
        self.affinity_of = {o: self.affinity.labels(o) for o in ("hit", "miss")}
        self.class_checks_of = {(g, e): self.class_checks.labels(g, e) for g in CLASSES for e in CLASSES}
        self.class_disagreements_of = {(g, e): self.class_disagreements.labels(g, e)
                                       for g in CLASSES for e in CLASSES if g != e}
        self.request_seconds_of = {c: self.request_seconds.labels(c) for c in CLASSES}
        for direction in ("short_to_long", "long_to_short"):
            self.rebalances.labels(direction)

    def render(self) -> bytes:
        return generate_latest(self.registry)
