"""The builtin engine's `laps_engine_*` series, exported from SGLang's scheduler process.

Where they are served: SGLang runs its scheduler in a child process and, with
`--enable-metrics`, already aggregates every process's series through prometheus_client's
multiprocess directory (PROMETHEUS_MULTIPROC_DIR, set by SGLang's launcher before the children
start) into the HTTP server's `/metrics`. Writing ours into the same directory puts them on the
engine's own port and path, which the operator's PodMonitor already scrapes (port `http`,
`/metrics`): dashboards and the allocation loop need no change and no extra port. Without
`--enable-metrics` there is no such directory; then `LAPS_METRICS_PORT` (if set) serves them on
a port of their own, else they are not exported (logged once).

The series are defined once, by laps_agent/engine/metrics.py's `EngineSeries` (docs/contracts.md),
which the builtin engine's metrics extend too, and the labels-file reader is that module's (it
needs only prometheus_client and torch-free laps_agent modules). SGLang runs no bucketed batch
prefill, so the bucket and padding counters exist but stay 0.
"""
from __future__ import annotations

import logging
import os
import time

from prometheus_client import CollectorRegistry, start_http_server

from laps_agent.engine.metrics import EngineSeries, read_group
from laps_agent.policy.classes import CLASSES

log = logging.getLogger("laps.sglang_plugin")
# How often the scheduler loop re-reads the pod's labels file (the builtin engine re-reads it per
# scrape; the loop passes at least once a second even when idle, SGLang's --sleep-on-idle poll).
_GROUP_REREAD_S = 1.0


class PluginMetrics(EngineSeries):
    def __init__(self, model: str, labels_file: str | None) -> None:
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        # Gauges of one live process: the most recent value of a live pid wins in aggregation.
        super().__init__(CollectorRegistry(), gauge_mode="livemostrecent")
        r = self.registry
        for queue in CLASSES:
            self.queue_requests.labels(queue).set(0)
            self.queue_tokens.labels(queue).set(0)
        self.model, self.labels_file = model, labels_file
        self.group: str | None = None  # the group `info` shows now
        self._group_read_at = float("-inf")
        self.follow_group(time.perf_counter())
        port = os.environ.get("LAPS_METRICS_PORT")
        if not self.multiprocess:
            if port:
                start_http_server(int(port), registry=r)
                log.info("LAPS metrics on :%s/metrics (SGLang runs without --enable-metrics)", port)
            else:
                log.warning("LAPS metrics are not exported: start SGLang with --enable-metrics "
                            "(or set LAPS_METRICS_PORT)")

    def set_queues(self, pending: dict[str, tuple[int, int]]) -> None:
        for queue in CLASSES:
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
