"""A prefill engine measures its prefill speed at start-up (engine/calibration.py): a fresh one
reports in /get_load what it can prefill within half its KV hand-off timeout before it has served
anything, so the gateway's admission holds for a new pod's first burst; the measuring leaves the
KV pool and the prefix cache as they were."""
from __future__ import annotations

import httpx

from laps_agent.engine.calibration import calibrate_prefill
from laps_agent.engine.engine import Engine, EngineConfig
from laps_agent.engine.load_report import load_report
from laps_agent.engine.runner import ModelRunner
from laps_agent.scheduling.window import CALIBRATION_TOKENS
from tests.support.metrics_text import metric_value


def test_calibration_feeds_the_cost_model_and_leaves_the_kv_pool_whole(tiny_loaded):
    runner = ModelRunner(tiny_loaded, num_pages=256, page_size=16)
    engine = Engine(runner, tiny_loaded.tokenizer, EngineConfig(role="prefill", context_len=4096))
    assert "max_pending_tokens" not in load_report("prefill", {"prefill_cost": engine.scheduler.prefill_cost()},
                                                   0, bootstrap_timeout_s=30)
    samples = calibrate_prefill(engine)
    assert [tokens for tokens, _ in samples] == list(CALIBRATION_TOKENS)
    assert all(seconds > 0 for _, seconds in samples)
    overhead, per_token = engine.scheduler.prefill_cost()
    assert overhead >= 0 and per_token >= 0
    figure = load_report("prefill", {"prefill_cost": (overhead, per_token)}, 0, bootstrap_timeout_s=30)
    assert figure["max_pending_tokens"] >= 1
    # Nothing held, nothing cached: a client's first prompt finds the pool as it would have.
    assert engine.kv.free_pages == 256 and engine.kv.cached_pages == 0


def test_a_fresh_prefill_engine_reports_its_figure_before_serving_anything(engine_launcher, tiny_engine_model):
    prefill = engine_launcher(tiny_engine_model, "prefill", ("--kv-pages", "512", "--bootstrap-timeout", "30"))
    decode = engine_launcher(tiny_engine_model, "decode", ("--kv-pages", "512"))
    report = httpx.get(prefill.url + "/get_load", timeout=10).json()
    assert report["waiting_requests"] == 0 and report["max_pending_tokens"] >= 1, report
    assert "prefill speed measured: 64 tokens in" in prefill.log_tail(100_000)
    # The same figure for Prometheus (the dashboard's headroom panel).
    assert metric_value(httpx.get(prefill.url + "/metrics", timeout=10).text,
                        "laps_engine_prefill_in_time_tokens") == report["max_pending_tokens"]
    # A decode engine prefills nothing: it measures nothing and reports no figure.
    assert "max_pending_tokens" not in httpx.get(decode.url + "/get_load", timeout=10).json()
    assert "laps_engine_prefill_in_time_tokens" not in httpx.get(decode.url + "/metrics", timeout=10).text
