"""The builtin engine's `laps_engine_*` series, exported from SGLang's scheduler process.

Where they are served: SGLang runs its scheduler in a child process and, with
`--enable-metrics`, already aggregates every process's series through prometheus_client's
multiprocess directory (PROMETHEUS_MULTIPROC_DIR, set by SGLang's launcher before the children
start) into the HTTP server's `/metrics`. Writing ours into the same directory puts them on the
engine's own port and path, which the operator's PodMonitor already scrapes (port `http`,
`/metrics`): dashboards and the allocation loop need no change and no extra port. Without
`--enable-metrics` there is no such directory; then `LAPS_METRICS_PORT` (if set) serves them on
a port of their own, else they are not exported (logged once).

Names, labels and buckets are those of laps_agent/engine/metrics.py (docs/contracts.md). SGLang
runs no bucketed batch prefill, so the bucket and padding counters exist but stay 0.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("laps.sglang_plugin")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


class PluginMetrics:
    def __init__(self, model: str, group: str | None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r = CollectorRegistry()
        # Gauges of one live process: the most recent value of a live pid wins in aggregation.
        g = {"multiprocess_mode": "livemostrecent"}
        self.queue_requests = Gauge("laps_engine_queue_requests", "Requests waiting for prefill", ["queue"], registry=r, **g)
        self.queue_tokens = Gauge("laps_engine_queue_tokens", "Uncached prompt tokens waiting for prefill", ["queue"], registry=r, **g)
        self.ttft = Histogram("laps_engine_ttft_seconds", "Arrival to first token", ["class"], buckets=_LATENCY_BUCKETS, registry=r)
        self.prefill_latency = Histogram("laps_engine_prefill_latency_seconds", "Duration of one prefill batch", ["class"], buckets=_LATENCY_BUCKETS, registry=r)
        self.prefill_batch_size = Histogram("laps_engine_prefill_batch_size", "Requests per prefill batch", buckets=_BATCH_BUCKETS, registry=r)
        self.bucket_hits = Counter("laps_engine_bucket_hits_total", "Short prefill batches run in a captured bucket", registry=r)
        self.bucket_misses = Counter("laps_engine_bucket_misses_total", "Short prefill batches no bucket covered (ran eager)", registry=r)
        self.padding = Counter("laps_engine_padding_tokens_total", "Padding tokens computed by bucketed prefill", registry=r)
        self.kv_usage = Gauge("laps_engine_kv_usage_ratio", "Share of KV pages in use", registry=r, **g)
        self.running = Gauge("laps_engine_running_requests", "Requests decoding", registry=r, **g)
        self.info = Gauge("laps_engine_info", "Engine identity; value 1", ["role", "group", "model"], registry=r, **g)
        for queue in ("short", "long"):
            self.queue_requests.labels(queue).set(0)
            self.queue_tokens.labels(queue).set(0)
        self.info.labels("prefill", group or "", model).set(1)
        self.registry = r
        port = os.environ.get("LAPS_METRICS_PORT")
        if not self.multiprocess:
            if port:
                from prometheus_client import start_http_server

                start_http_server(int(port), registry=r)
                log.info("LAPS metrics on :%s/metrics (SGLang runs without --enable-metrics)", port)
            else:
                log.warning("LAPS metrics are not exported: start SGLang with --enable-metrics "
                            "(or set LAPS_METRICS_PORT)")

    def set_queues(self, pending: dict[str, tuple[int, int]]) -> None:
        for queue in ("short", "long"):
            reqs, toks = pending.get(queue, (0, 0))
            self.queue_requests.labels(queue).set(reqs)
            self.queue_tokens.labels(queue).set(toks)

    def observe_batch(self, cls: str, size: int, seconds: float) -> None:
        self.prefill_latency.labels(cls).observe(seconds)
        self.prefill_batch_size.observe(size)

    def observe_first_token(self, cls: str, seconds: float) -> None:
        self.ttft.labels(cls).observe(seconds)
