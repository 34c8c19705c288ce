"""One request id in the gateway's answer, the gateway's log and the engines' logs (real
emulated-engine processes on loopback): an operator handed a failed request's `x-request-id`
finds it on every side. Here the prefill group is too slow for the decode engine's KV wait, the
PD failure a gateway cannot retry (failures.py)."""
from __future__ import annotations

import logging

import httpx
import openai
import pytest

from tests.support.emulated_profiles import synthetic_profile
from tests.support.fixtures_gateway import poll

# A prefill takes 3 s, while the engines wait at most 0.5 s for a KV hand-off.
PROFILE = synthetic_profile("slow-prefill", served="test-model", prefill={"overhead_s": 3.0})


def test_a_failed_request_is_named_alike_by_client_gateway_and_decode_engine(
        engine_launcher, tiny_engine_model, gateway_server, tmp_path, caplog):
    import yaml

    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    profile = tmp_path / "slow-prefill.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    extra = ("--backend", "emulated", "--profile", str(profile), "--wait-window-ms", "0",
             "--bootstrap-timeout", "0.5")
    prefill = engine_launcher(tiny_engine_model, "prefill", extra)
    decode = engine_launcher(tiny_engine_model, "decode", extra)
    gateway = gateway_server(StaticDiscovery(StaticSpec((prefill.url,), (), (decode.url,))),
                             served_model_name="test-model")
    caplog.set_level(logging.INFO, logger="laps_agent")
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                       timeout=60) as client, pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="test-model", prompt="hello", max_tokens=2)
    assert caught.value.status_code == 503, caught.value
    rid = caught.value.request_id
    assert rid
    gateway_lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(rid in line and "failed with 503" in line for line in gateway_lines), gateway_lines
    poll(lambda: f"request {rid} failed with 504 bootstrap_error" in decode.log_tail(20000),
         message="the decode engine's log line naming the request")


def test_an_engine_echoes_a_callers_id_and_makes_one_otherwise(engine_launcher, tiny_engine_model,
                                                               tmp_path):
    import yaml

    profile = tmp_path / "fast.yaml"
    profile.write_text(yaml.safe_dump(synthetic_profile("fast", served="test-model")))
    engine = engine_launcher(tiny_engine_model, "mixed", ("--backend", "emulated", "--profile",
                                                          str(profile)))
    body = {"model": "test-model", "prompt": "hello", "max_tokens": 2}
    mine = httpx.post(f"{engine.url}/v1/completions", json=body, headers={"x-request-id": "abc-1"})
    assert mine.status_code == 200 and mine.headers["x-request-id"] == "abc-1"
    refused = httpx.post(f"{engine.url}/v1/completions", content=b"{nope")
    assert refused.status_code == 400 and len(refused.headers["x-request-id"]) == 32
