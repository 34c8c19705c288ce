"""Text no tokenizer can encode (a lone UTF-16 surrogate such as "\\ud800", which JSON allows
as an escape) is the client's error: a 400 naming where it is, from the gateway and from the
engine server alike, never a 500. Valid escapes (surrogate pairs) still work."""
from __future__ import annotations

import httpx
import pytest

# Raw JSON: `json=` in httpx would refuse to encode a lone surrogate itself.
BAD_BODIES = [
    ("/v1/completions", rb'{"prompt": "hello \ud800 world", "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions",
     rb'{"messages": [{"role": "user", "content": "hi \udfff"}], "max_tokens": 2}', "messages[0].content"),
    ("/generate", rb'{"text": "a\ud800", "sampling_params": {"max_new_tokens": 2}}', "text"),
    ("/v1/completions", rb'{"prompt": "fine", "stop": ["\ud800"], "max_tokens": 2}', "stop[0]"),
]
GOOD_BODY = rb'{"prompt": "emoji \ud83d\ude00 and \u00e9", "max_tokens": 2}'


def _post(url: str, path: str, raw: bytes) -> httpx.Response:
    return httpx.post(url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)


def _assert_400_naming(reply: httpx.Response, where: str) -> None:
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert message.startswith(f"{where} is not valid Unicode text"), message


@pytest.fixture
def tokenizer_gateway(tiny_pd_engines, gateway_server, tiny_engine_model):
    """The gateway counting tokens with the engines' own tokenizer, over real PD engines."""
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
    from laps_agent.gateway.estimate import TokenEstimator
    from laps_agent.modelio.tokenizer import load_tokenizer

    spec = StaticSpec((tiny_pd_engines.prefill.url,), (), (tiny_pd_engines.decode.url,))
    return gateway_server(StaticDiscovery(spec), served_model_name="test-model",
                          estimator=TokenEstimator(load_tokenizer(tiny_engine_model)))


@pytest.mark.parametrize("path, raw, where", BAD_BODIES)
def test_the_gateway_answers_400_and_routes_nothing(tokenizer_gateway, path, raw, where):
    _assert_400_naming(_post(tokenizer_gateway.url, path, raw), where)
    routed = [line for line in httpx.get(tokenizer_gateway.url + "/metrics").text.splitlines()
              if line.startswith("laps_gateway_requests_total{")]
    assert routed and all(line.endswith(" 0.0") for line in routed)  # refused before routing


def test_valid_escapes_pass_through_the_gateway_to_the_engines(tokenizer_gateway):
    reply = _post(tokenizer_gateway.url, "/v1/completions", GOOD_BODY)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] is not None


@pytest.mark.parametrize("path, raw, where", BAD_BODIES)
def test_the_engine_server_answers_400(tiny_mixed_engine, path, raw, where):
    _assert_400_naming(_post(tiny_mixed_engine.url, path, raw), where)


def test_the_engine_server_takes_valid_escapes(tiny_mixed_engine):
    reply = _post(tiny_mixed_engine.url, "/v1/completions", GOOD_BODY)
    assert reply.status_code == 200, reply.text


def test_a_pd_decode_engine_answers_400_before_waiting_for_any_kv(tiny_pd_engines):
    raw = (rb'{"prompt": "x\ud800", "max_tokens": 2, "bootstrap_host": "127.0.0.1", '
           rb'"bootstrap_port": 9, "bootstrap_room": 1}')
    _assert_400_naming(_post(tiny_pd_engines.decode.url, "/v1/completions", raw), "prompt")
