"""Identity, health and metrics of a real engine, incl. the group read from the labels file."""
from __future__ import annotations

import httpx

CONTRACT_SERIES = [
    "laps_engine_queue_requests", "laps_engine_queue_tokens", "laps_engine_ttft_seconds",
    "laps_engine_prefill_latency_seconds", "laps_engine_prefill_batch_size", "laps_engine_bucket_hits_total",
    "laps_engine_bucket_misses_total", "laps_engine_padding_tokens_total", "laps_engine_kv_usage_ratio",
    "laps_engine_running_requests", "laps_engine_info",
]


def test_group_follows_the_labels_file_without_restart(engine_launcher, tiny_engine_model, tmp_path):
    labels = tmp_path / "labels"
    labels.write_text('app.kubernetes.io/name="laps"\nlaps.io/prefill-group="short"\n')
    engine = engine_launcher(tiny_engine_model, "prefill", ("--length-threshold", "100"), labels_file=labels,
                             served_model_name="tiny")
    info = engine.get_json("/get_server_info")
    assert info["prefill_group"] == "short"
    assert {k: info[k] for k in ("role", "bootstrap_port", "served_model_name", "length_threshold")} == {
        "role": "prefill", "bootstrap_port": engine.bootstrap_port, "served_model_name": "tiny",
        "length_threshold": 100}
    assert 'laps_engine_info{group="short",model="tiny",role="prefill"} 1.0' in httpx.get(engine.url + "/metrics").text
    labels.write_text('laps.io/prefill-group="long"\n')  # the operator relabelled the pod
    assert engine.get_json("/get_server_info")["prefill_group"] == "long"
    metrics = httpx.get(engine.url + "/metrics").text
    assert 'group="long"' in metrics and 'group="short"' not in metrics


def test_metrics_use_the_contract_names_and_count_work(tiny_mixed_engine):
    resp = httpx.post(tiny_mixed_engine.url + "/generate", timeout=60,
                      json={"text": "count me", "sampling_params": {"max_new_tokens": 2}})
    assert resp.status_code == 200
    text = httpx.get(tiny_mixed_engine.url + "/metrics").text
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for series in CONTRACT_SERIES:
        assert any(n == series or n.startswith(series + "_") for n in names), series
    count = [line for line in text.splitlines() if line.startswith('laps_engine_ttft_seconds_count{class="short"}')]
    assert count and float(count[0].split()[-1]) >= 1


def test_health_endpoints_and_models(tiny_mixed_engine):
    assert httpx.get(tiny_mixed_engine.url + "/health").status_code == 200
    assert httpx.get(tiny_mixed_engine.url + "/health_generate", timeout=60).status_code == 200
    models = httpx.get(tiny_mixed_engine.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "test-model"
    info = tiny_mixed_engine.get_json("/get_server_info")
    assert info["role"] == "mixed" and info["bootstrap_port"] is None and info["prefill_group"] is None
