"""A prefill engine measures its prefill speed at start-up (engine/calibration.py): a fresh one
reports in /get_load what it can prefill within half its KV hand-off timeout before it has served
anything, so the gateway's admission holds for a new pod's first burst; the measuring leaves the
KV pool and the prefix cache as they were."""
from __future__ import annotations

import math
import queue

import httpx

from laps_agent.engine.core.calibration import calibrate_prefill
from laps_agent.engine.core.load_report import load_report
from laps_agent.engine.core.requests import GenerateWork
from laps_agent.engine.engine import Engine, EngineConfig
from laps_agent.engine.model.runner import ModelRunner
from laps_agent.engine.model.sampling import SamplingParams
from laps_agent.policy.scheduling.window import CALIBRATION_TOKENS
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


def test_an_engine_whose_calibration_fails_serves_without_the_figure(tiny_loaded, caplog):
    """Measuring feeds an estimate; it must not keep an engine from serving (a device error in a
    prefill fails that request alone, not the pod)."""
    runner = ModelRunner(tiny_loaded, num_pages=256, page_size=16)
    engine = Engine(runner, tiny_loaded.tokenizer, EngineConfig(role="prefill", context_len=4096))

    def failing_forward(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    runner.forward, real_forward = failing_forward, runner.forward
    assert calibrate_prefill(engine) == []
    assert "prefill speed not measured at start-up (RuntimeError: CUDA error: out of memory)" in caplog.text
    assert engine.scheduler.prefill_cost() is None and engine.kv.free_pages == 256
    runner.forward = real_forward   # the device recovered: the engine serves, and measures its batches
    engine.start()
    try:
        outs: queue.Queue = queue.Queue()
        engine.submit(GenerateWork("r", list(range(1, 41)), SamplingParams(max_new_tokens=1, temperature=0.0)), outs.put)
        while not (out := outs.get(timeout=60)).finished:
            pass
        assert out.error is None and engine.scheduler.prefill_cost() is not None
    finally:
        engine.stop()


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
    # Its cost fit too (the planner's prefill cost); a decode engine's step cost waits for its steps.
    prefill_metrics = httpx.get(prefill.url + "/metrics", timeout=10).text
    assert metric_value(prefill_metrics, "laps_engine_prefill_cost_seconds", term="per_token") > 0
    assert math.isnan(metric_value(httpx.get(decode.url + "/metrics", timeout=10).text,
                                   "laps_engine_decode_cost_seconds", term="overhead"))
