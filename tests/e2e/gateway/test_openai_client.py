"""The official `openai` client, through the gateway, against real builtin engines (tiny model,
prefill + decode processes on loopback): chat and completions, streamed and not."""
from __future__ import annotations

import openai
import pytest



@pytest.fixture
def engine_gateway(tiny_pd_engines, gateway_server):
    from laps_agent.gateway.discovery import StaticDiscovery, StaticSpec

    spec = StaticSpec((tiny_pd_engines.prefill.url,), (), (tiny_pd_engines.decode.url,))
    gateway = gateway_server(StaticDiscovery(spec), served_model_name="test-model")
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", timeout=120,
                           max_retries=0)
    yield gateway, client, tiny_pd_engines
    client.close()


def test_completions_non_streaming(engine_gateway):
    gateway, client, engines = engine_gateway
    done = client.completions.create(model="test-model", prompt="Once upon a time",
                                     max_tokens=5, temperature=0)
    assert done.choices[0].text
    assert done.usage.completion_tokens == 5
    # Bootstrap port learnt from the prefill engine's /get_server_info:
    pods = gateway.gateway.discovery.membership().groups["short"]
    assert pods[0].bootstrap_port == engines.prefill.bootstrap_port


def test_completions_streaming(engine_gateway):
    _, client, _ = engine_gateway
    stream = client.completions.create(model="test-model", prompt="Once upon a time",
                                       max_tokens=5, temperature=0, stream=True)
    pieces = [chunk.choices[0].text for chunk in stream if chunk.choices]
    assert "".join(pieces)


def test_chat_non_streaming_and_streaming_agree(engine_gateway):
    _, client, _ = engine_gateway
    messages = [{"role": "user", "content": "Say something."}]
    whole = client.chat.completions.create(model="test-model", messages=messages,
                                           max_tokens=6, temperature=0)
    text = whole.choices[0].message.content
    assert text
    stream = client.chat.completions.create(model="test-model", messages=messages,
                                            max_tokens=6, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == text  # greedy: the same tokens either way


def test_unknown_model_is_a_clear_not_found(engine_gateway):
    _, client, _ = engine_gateway
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.completions.create(model="nope", prompt="x", max_tokens=1)


def test_models_lists_the_served_model(engine_gateway):
    _, client, _ = engine_gateway
    assert [m.id for m in client.models.list()] == ["test-model"]
