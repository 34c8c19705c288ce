"""The engine's Prometheus series (names fixed by docs/contracts.md) and the pod's group label.

`EngineSeries` defines the `laps_engine_*` series every kind of LAPS engine exports: the builtin
and the emulated engine (`EngineMetrics` below adds what only they measure) and the SGLang plugin
(sglang_plugin/metrics.py). One definition, so names, help, labels and buckets cannot drift
apart and one dashboard reads every kind of pod alike. Torch-free: the plugin imports it in
SGLang's scheduler process."""
from __future__ import annotations

import logging
import math
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from laps_agent.engine.core.config import PrefillRecord
from laps_agent.engine.core.load_report import in_time_tokens
from laps_agent.engine.core.warm_queue import WARM_OUTCOMES
from laps_agent.policy.classes import CLASSES, SHORT
from laps_agent.serving.metric_buckets import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS

log = logging.getLogger(__name__)

GROUP_LABEL = "laps.io/prefill-group"
_LABEL_LINE = re.compile(r'^\s*([^=\s]+)\s*=\s*"(.*)"\s*$')
_CACHED_TOKEN_BUCKETS = (0, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def read_labels(path: str | Path | None) -> dict[str, str]:
    """Parse a downward-API labels file (`key="value"` per line); missing file -> {}."""
    if not path:
        return {}
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    labels = {}
    for line in text.splitlines():
        match = _LABEL_LINE.match(line)
        if match:
            labels[match.group(1)] = match.group(2).encode().decode("unicode_escape")
    return labels


def read_group(path: str | Path | None) -> str | None:
    group = read_labels(path).get(GROUP_LABEL)
    return group if group in CLASSES else None


class EngineSeries:
    """The `laps_engine_*` series of every LAPS engine (module docstring), in `registry`.
    `gauge_mode`: the gauges' prometheus_client multiprocess mode, for an engine whose series
    several processes write (the SGLang plugin's); None for the library's default."""

    def __init__(self, registry: CollectorRegistry, gauge_mode: str | None = None) -> None:
        r, g = registry, ({"multiprocess_mode": gauge_mode} if gauge_mode else {})
        self.registry = registry
        self.queue_requests = Gauge("laps_engine_queue_requests", "Requests waiting for prefill", ["queue"], registry=r, **g)
        self.queue_tokens = Gauge("laps_engine_queue_tokens", "Uncached prompt tokens waiting for prefill", ["queue"], registry=r, **g)
        self.ttft = Histogram("laps_engine_ttft_seconds", "Arrival to first token", ["class"], buckets=LATENCY_BUCKETS, registry=r)
        self.prefill_latency = Histogram("laps_engine_prefill_latency_seconds", "Duration of one prefill batch", ["class"], buckets=LATENCY_BUCKETS, registry=r)
        self.prefill_batch_size = Histogram("laps_engine_prefill_batch_size", "Requests per prefill batch", buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.bucket_hits = Counter("laps_engine_bucket_hits_total", "Short prefill batches run in a captured bucket", registry=r)
        self.bucket_misses = Counter("laps_engine_bucket_misses_total", "Short prefill batches no bucket covered (ran eager)", registry=r)
        self.padding = Counter("laps_engine_padding_tokens_total", "Padding tokens computed by bucketed prefill", registry=r)
        self.kv_usage = Gauge("laps_engine_kv_usage_ratio", "Share of KV pages in use", registry=r, **g)
        self.running = Gauge("laps_engine_running_requests", "Requests decoding", registry=r, **g)
        self.info = Gauge("laps_engine_info", "Engine identity; value 1", ["role", "group", "model"], registry=r, **g)


class EngineMetrics(EngineSeries):
    """The builtin (and emulated) engine's series: EngineSeries' and what only it measures."""

    def __init__(self, role: str, model: str, labels_file: str | None,
                 bootstrap_timeout_s: float | None = None) -> None:
        super().__init__(CollectorRegistry())
        r = self.registry
        self.role, self.model, self.labels_file = role, model, labels_file
        self.bootstrap_timeout_s = bootstrap_timeout_s
        # Prefix cache: hit rate = hit tokens / lookup tokens (prompt tokens that reached prefill).
        self.prefix_lookup = Counter("laps_engine_prefix_cache_lookup_tokens_total", "Prompt tokens prefilled here, cached or not", registry=r)
        self.prefix_hit = Counter("laps_engine_prefix_cache_hit_tokens_total", "Prompt tokens whose KV came from the prefix cache", registry=r)
        self.cached_tokens = Histogram("laps_engine_prefix_cached_tokens", "Prefix-cached prompt tokens per request", buckets=_CACHED_TOKEN_BUCKETS, registry=r)
        self.prefix_evicted = Counter("laps_engine_prefix_cache_evicted_pages_total", "Prefix-cache pages evicted to make room", registry=r)
        self.prefix_pages = Gauge("laps_engine_prefix_cache_pages", "KV pages the prefix cache holds (in use or evictable)", registry=r)
        # Prefix warming (prefix_warm.py): warms by outcome, and the tokens they computed.
        self.prefix_warm = Counter("laps_engine_prefix_warm_total", f"Prefix warms by outcome ({', '.join(WARM_OUTCOMES)})", ["outcome"], registry=r)
        self.prefix_warm_tokens = Counter("laps_engine_prefix_warm_tokens_total", "Tokens computed into the prefix cache by warms", registry=r)
        for outcome in WARM_OUTCOMES:
            self.prefix_warm.labels(outcome)
        # This engine's class (uncached tokens at admission) against the one the gateway chose:
        # off-diagonal series count misclassifications (gateway_class="none": it sent none).
        self.classes = Counter("laps_engine_class_total", "Prefilled requests by gateway and engine class", ["gateway_class", "engine_class"], registry=r)
        # Clients that hung up before their whole answer (mid-upload, waiting, mid-stream): a
        # client's own timeout, not an engine error, so counted apart from failures.
        self.client_disconnects = Counter("laps_engine_client_disconnects_total", "Requests whose client hung up before its whole answer", registry=r)
        # A prefill engine's admission figure (load_report.in_time_tokens), beside its queued
        # tokens: the headroom before the gateway answers 429. Not exported by other roles.
        self.prefill_in_time = Gauge(
            "laps_engine_prefill_in_time_tokens", "Uncached prompt tokens this prefill engine expects to prefill "
            "within half its KV hand-off timeout at its measured speed; the gateway admits to it up to this",
            registry=r) if role == "prefill" else None
        # The prefill engine's own cost fit (a batch of T uncached tokens takes overhead + per_token
        # x T seconds): what the gateway predicts with, and the planner sizes the pool from.
        self.prefill_cost = Gauge(
            "laps_engine_prefill_cost_seconds", "This prefill engine's measured cost of a prefill batch: "
            "term=overhead (seconds a batch) and term=per_token (seconds an uncached token); NaN until measured",
            ["term"], registry=r) if role == "prefill" else None
        # A decode engine's fit of its steps (overhead + per request x requests in the step): the
        # planner's decode cost, against the ITL SLO.
        self.decode_cost = Gauge(
            "laps_engine_decode_cost_seconds", "This decode engine's measured cost of a decode step: term=overhead "
            "(seconds a step) and term=per_request (seconds a request in it); NaN until measured",
            ["term"], registry=r) if role == "decode" else None
        for queue in CLASSES:
            self.queue_requests.labels(queue)
            self.queue_tokens.labels(queue)
            for gateway_class in (*CLASSES, "none"):
                self.classes.labels(gateway_class, queue)

    # engine-thread hooks (prometheus_client is thread-safe)
    def observe_prefill(self, rec: PrefillRecord, batch_prefill_graphs: bool) -> None:
        cls = rec.cls or "fifo"
        self.prefill_latency.labels(cls).observe(rec.seconds)
        self.prefill_batch_size.observe(rec.size)
        if rec.path in ("bucket", "graph"):
            self.bucket_hits.inc()
            self.padding.inc(max(rec.padded_tokens - rec.real_tokens, 0))
        elif batch_prefill_graphs and rec.cls == SHORT:
            self.bucket_misses.inc()
        for req in rec.requests:
            self.prefix_lookup.inc(req.prompt_tokens)
            self.prefix_hit.inc(req.cached_tokens)
            self.cached_tokens.observe(req.cached_tokens)
            gateway = req.gateway_cls if req.gateway_cls in CLASSES else "none"
            self.classes.labels(gateway, req.cls).inc()
        if rec.evicted_pages:
            self.prefix_evicted.inc(rec.evicted_pages)

    def observe_warm(self, outcome: str, tokens: int) -> None:
        if outcome == "chunk":
            self.prefix_warm_tokens.inc(tokens)
        else:
            self.prefix_warm.labels(outcome).inc()

    def observe_first_token(self, cls: str | None, seconds: float) -> None:
        # A decode engine's first token is the prefill engine's, already counted there; its own
        # "arrival" is the KV's, so a sample here would be a near-zero TTFT that every panel
        # summing over pods mixes into the prefill engines' (one per request, halving quantiles).
        if self.role == "decode":
            return
        self.ttft.labels(cls or SHORT).observe(seconds)

    def render(self, snapshot: dict) -> bytes:
        queues = snapshot.get("queues") or {}
        for queue in CLASSES:
            reqs, toks = queues.get(queue, (0, 0))
            if queue == SHORT and "fifo" in queues:
                reqs, toks = reqs + queues["fifo"][0], toks + queues["fifo"][1]
            self.queue_requests.labels(queue).set(reqs)
            self.queue_tokens.labels(queue).set(toks)
        self.kv_usage.set(snapshot.get("kv_usage", 0.0))
        self.running.set(snapshot.get("running", 0))
        self.prefix_pages.set(snapshot.get("prefix_cache_pages", 0))
        if self.prefill_in_time is not None:
            figure = in_time_tokens(self.role, snapshot.get("prefill_cost"), self.bootstrap_timeout_s)
            self.prefill_in_time.set(math.nan if figure is None else figure)  # NaN: not measured yet
        if self.prefill_cost is not None:
            cost = snapshot.get("prefill_cost") or (math.nan, math.nan)
            self.prefill_cost.labels("overhead").set(cost[0])
            self.prefill_cost.labels("per_token").set(cost[1])
        if self.decode_cost is not None:
            cost = snapshot.get("decode_cost") or (math.nan, math.nan)
            self.decode_cost.labels("overhead").set(cost[0])
            self.decode_cost.labels("per_request").set(cost[1])
        # The group label changes under a running pod (operator relabels): re-read every scrape.
        self.info.clear()
        self.info.labels(self.role, read_group(self.labels_file) or "", self.model).set(1)
        return generate_latest(self.registry)
