"""A prefill pod that never hands its KV over: the decode engine gives up after its bootstrap
timeout (504 `bootstrap_error`). That is the prefill group's failure, not the decode pod's: the
client gets a 503 naming the overloaded group, the decode pod stays healthy and keeps serving
the other class, and the group's only pod is not ejected either (ejection cap)."""
from __future__ import annotations

import httpx
import pytest
import yaml

from laps_agent.policy.classes import CLASSES
from tests.support.metrics_text import metric_value as _metric
from tests.support.waiting import poll


def _profile(name: str, prefill_overhead_s: float) -> dict:
    return {"name": name, "provenance": "synthetic",
            "model": {"name": "kv-timeout-test", "kv_bytes_per_token": 1000},
            "engine": {"kv_capacity_tokens": 65536, "page_size": 16, "context_length": 8192},
            "prefill": {"overhead_s": prefill_overhead_s, "per_token_s": 0.0},
            "decode": {"overhead_s": 0.001}, "transfer": {"bytes_per_s": 1.0e10}}



@pytest.fixture
def stuck_long_group(engine_launcher, tiny_engine_model, gateway_server, tmp_path):
    """short: a prefill engine answering at once; long: one whose prefill takes an hour; one
    decode engine that waits 1 s for a KV hand-off."""
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    def emulated(role: str, profile: dict, *extra: str):
        path = tmp_path / f"{profile['name']}.yaml"
        path.write_text(yaml.safe_dump(profile))
        return engine_launcher(tiny_engine_model, role, ("--backend", "emulated", "--profile", str(path),
                                                         "--wait-window-ms", "0", *extra))

    short = emulated("prefill", _profile("fast", 0.001))
    long_ = emulated("prefill", _profile("stuck", 3600.0))
    decode = emulated("decode", _profile("fast", 0.001), "--bootstrap-timeout", "1")
    discovery = StaticDiscovery(StaticSpec((short.url,), (long_.url,), (decode.url,)), poll_s=0.05)
    # Each class in its own group (the least-loaded router): the predicted one would route long
    # work around the stuck pod once its queue shows, which is not what this test is about.
    gateway = gateway_server(discovery, served_model_name="test-model", length_threshold=64,
                             router="least-loaded")
    poll(lambda: all(discovery.membership().groups.values()), message="both prefill groups")
    return gateway, long_


def test_a_decode_timeout_waiting_for_kv_blames_the_prefill_group_not_the_decode_pod(stuck_long_group):
    gateway, long_engine = stuck_long_group
    long_prompt = "many words " * 150
    for i in range(4):  # more than eject_after_failures (3): the old code ejected the decode pod here
        reply = httpx.post(f"{gateway.url}/v1/completions", timeout=60, json={
            "model": "test-model", "prompt": long_prompt, "max_tokens": 2, "stream": i % 2 == 1})
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["message"].startswith("the long prefill group is overloaded"), error
        assert "did not arrive" in error["message"]  # the decode engine's own account
        assert int(reply.headers["retry-after"]) >= 1
    status = httpx.get(f"{gateway.url}/laps_status").json()
    assert [p["healthy"] for p in status["decode"]["pods"]] == [True]
    assert [p["healthy"] for p in status["groups"]["long"]["pods"]] == [True]  # the group's last pod
    # The decode pod still serves: a short request goes through it.
    reply = httpx.post(f"{gateway.url}/v1/completions", timeout=60,
                       json={"model": "test-model", "prompt": "hi", "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert httpx.get(f"{gateway.url}/health").status_code == 200
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert _metric(metrics, "laps_gateway_errors_total", reason="prefill_overloaded") == 4
    assert _metric(metrics, "laps_gateway_ejections_total", pool="decode", outcome="ejected") == 0
    assert _metric(metrics, "laps_gateway_ejections_total", pool="long", outcome="capped") >= 1
    # The gateway gave up on the stuck prefill calls, and the engine dropped them.
    poll(lambda: httpx.get(long_engine.url + "/get_server_info").json()["state"]["live"] == 0,
         timeout=30, message="the stuck engine to drop the abandoned requests")


def test_openai_clients_do_not_resend_a_request_its_prefill_group_could_not_serve(stuck_long_group):
    """OpenAI's SDKs resend any 5xx twice by default: each resend of a prefill_overloaded 503
    waited another whole KV timeout in the overloaded group and added to its queue."""
    import openai

    gateway, _ = stuck_long_group
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")   # default retries
    with pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(model="test-model", prompt="many words " * 150, max_tokens=2)
    assert caught.value.status_code == 503
    assert caught.value.body["message"].startswith("the long prefill group is overloaded")
    metrics = httpx.get(f"{gateway.url}/metrics").text
    routed = sum(_metric(metrics, "laps_gateway_requests_total", **{"class": c, "group": g})
                 for c in CLASSES for g in CLASSES)
    assert routed == 1   # sent once (a resend is classed by what the gateway sent where)
    assert caught.value.response.headers["x-should-retry"] == "false"
