"""The SGLang plugin's `laps_engine_*` series against the builtin engine's (no SGLang here: the
plugin's metrics are plain prometheus_client; the real SGLang runs in tests/sglang)."""
from __future__ import annotations

import os
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from laps_agent.engine.metrics import EngineMetrics
from laps_agent.sglang_plugin.metrics import PluginMetrics
from tests.support.metrics_text import metric_value


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    # Served from this process's registry, as with SGLang run without --enable-metrics.
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("LAPS_METRICS_PORT", raising=False)


def _bounds(page: str, name: str) -> list[str]:
    return [s.labels["le"] for f in text_string_to_metric_families(page) for s in f.samples
            if s.name == name + "_bucket" and s.labels.get("class") == "short"]


def test_engine_and_plugin_ttft_histograms_tell_1_ms_from_5_ms_and_read_minutes():
    engine, plugin = EngineMetrics("prefill", "m", None), PluginMetrics("m", None)
    for observe in (engine.observe_first_token, plugin.observe_first_token):
        for seconds in (0.002, 0.004, 400.0):  # two GPU prefills of short prompts; an overload
            observe("short", seconds)
    pages = [generate_latest(m.registry).decode() for m in (engine, plugin)]
    for page in pages:
        bucket = "laps_engine_ttft_seconds_bucket"
        # The 2 ms sample sits apart from the 4 ms one (below 5 ms they were one bucket) ...
        assert metric_value(page, bucket, **{"class": "short", "le": "0.0025"}) == 1
        # ... and 400 s reads as at most 600 s, not as the last bound (60 s): a p99 of minutes.
        assert metric_value(page, bucket, **{"class": "short", "le": "300.0"}) == 2
        assert metric_value(page, bucket, **{"class": "short", "le": "600.0"}) == 3
    # Same bounds on both engines, so one dashboard panel reads both kinds of pod alike.
    for name in ("laps_engine_ttft_seconds", "laps_engine_prefill_latency_seconds"):
        engine.prefill_latency.labels("short").observe(0.1)
        plugin.observe_batch("short", 1, 0.1)
        pages = [generate_latest(m.registry).decode() for m in (engine, plugin)]
        assert _bounds(pages[0], name) == _bounds(pages[1], name)
        assert _bounds(pages[0], name)[0] == "0.001" and _bounds(pages[0], name)[-2:] == ["600.0", "+Inf"]


def test_plugin_engine_info_follows_the_operator_relabelling_the_pod(tmp_path):
    labels = tmp_path / "labels"
    labels.write_text('app="laps"\nlaps.io/prefill-group="short"\n')
    plugin = PluginMetrics("m", str(labels))

    def info() -> dict[str, float]:
        page = generate_latest(plugin.registry).decode()
        return {s.labels["group"]: s.value for f in text_string_to_metric_families(page)
                for s in f.samples if s.name == "laps_engine_info"}

    assert info() == {"short": 1.0}
    new = tmp_path / "labels.new"  # the kubelet swaps the file whole
    new.write_text('app="laps"\nlaps.io/prefill-group="long"\n')
    os.replace(new, labels)
    plugin.follow_group(time.perf_counter() + 5.0)  # the scheduler's next pass, seconds later
    assert info() == {"long": 1.0}
