"""The builtin engine's `laps_engine_*` series, exported from SGLang's scheduler process.

Where they are served: SGLang runs its scheduler in a child process and, with
`--enable-metrics`, already aggregates every process's series through prometheus_client's
multiprocess directory (PROMETHEUS_MULTIPROC_DIR, set by SGLang's launcher before the children
start) into the HTTP server's `/metrics`. Writing ours into the same directory puts them on the
engine's own port and path, which the operator's PodMonitor already scrapes (port `http`,
`/metrics`): dashboards and the allocation loop need no change and no extra port. Without
`--enable-metrics` there is no such directory; then `LAPS_METRICS_PORT` (if set) serves them on
a port of their own, else they are not exported (logged once).

Names, labels and buckets are those of laps_agent/engine/metrics.py (docs/contracts.md): the
bucket bounds come from laps_agent/serving/metric_buckets.py, as there, and the labels-file reader from
that module (which needs only prometheus_client and torch-free laps_agent modules). SGLang runs
no bucketed batch prefill, so the bucket and padding counters exist but stay 0.
"""
from __future__ import annotations

import logging
import os
import time

from laps_agent.engine.metrics import read_group
from laps_agent.serving.metric_buckets import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS

log = logging.getLogger("laps.sglang_plugin")
# How often the scheduler loop re-reads the pod's labels file (the builtin engine re-reads it per
# scrape; the loop passes at least once a second even when idle, SGLang's --sleep-on-idle poll).
_GROUP_REREAD_S = 1.0


class PluginMetrics:
    def __init__(self, model: str, labels_file: str | None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r = CollectorRegistry()
        # Gauges of one live process: the most recent value of a live pid wins in aggregation.
        g = {"multiprocess_mode": "livemostrecent"}
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
        for queue in ("short", "long"):
            self.queue_requests.labels(queue).set(0)
            self.queue_tokens.labels(queue).set(0)
        self.model, self.labels_file = model, labels_file
        self.group: str | None = None  # the group `info` shows now
        self._group_read_at = float("-inf")
        self.follow_group(time.perf_counter())
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

    def set_load(self, running: int, kv_usage: float) -> None:
        self.running.set(running)
        self.kv_usage.set(kv_usage)

    def follow_group(self, now: float) -> None:
        """Re-read the pod's group (at most every _GROUP_REREAD_S of `now`, perf_counter): the
        operator relabels a running prefill pod between short and long and the kubelet rewrites
        the labels file. prometheus_client cannot remove a series in multiprocess mode, so there
        the former group's series stays, at 0; served on a port of its own it goes, as in the
        builtin engine."""
        if now - self._group_read_at < _GROUP_REREAD_S:
            return
        self._group_read_at = now
        group = read_group(self.labels_file) or ""
        if group == self.group:
            return
        if self.group is not None:
            if self.multiprocess:
                self.info.labels("prefill", self.group, self.model).set(0)
            else:
                self.info.remove("prefill", self.group, self.model)
        self.info.labels("prefill", group, self.model).set(1)
        self.group = group

    def observe_batch(self, cls: str, size: int, seconds: float) -> None:
        self.prefill_latency.labels(cls).observe(seconds)
        self.prefill_batch_size.observe(size)

    def observe_first_token(self, cls: str, seconds: float) -> None:
        self.ttft.labels(cls).observe(seconds)
