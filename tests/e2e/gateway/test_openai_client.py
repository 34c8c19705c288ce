"""The official `openai` client, through the gateway, against real builtin engines (tiny model,
prefill + decode processes on loopback): chat and completions, streamed and not."""
from __future__ import annotations

import openai
import pytest


@pytest.fixture
def engine_gateway(tiny_pd_engines, gateway_server):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

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


API_KEY = "sk-laps-e2e-0123456789"


@pytest.fixture
def auth_gateway(tiny_pd_engines, gateway_server, tmp_path):
    """The same, with API keys on (`--api-keys-file`): returns a client factory by key."""
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    keys = tmp_path / "api-keys"
    keys.write_text(API_KEY + "\n")
    spec = StaticSpec((tiny_pd_engines.prefill.url,), (), (tiny_pd_engines.decode.url,))
    gateway = gateway_server(StaticDiscovery(spec), served_model_name="test-model",
                             api_keys_file=str(keys))
    clients: list[openai.OpenAI] = []

    def client(api_key: str) -> openai.OpenAI:
        clients.append(openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, timeout=120,
                                     max_retries=0))
        return clients[-1]

    yield client
    for c in clients:
        c.close()


def test_a_valid_api_key_is_served(auth_gateway):
    client = auth_gateway(API_KEY)
    done = client.completions.create(model="test-model", prompt="Once upon a time",
                                     max_tokens=3, temperature=0)
    assert done.usage.completion_tokens == 3
    assert [m.id for m in client.models.list()] == ["test-model"]


@pytest.mark.parametrize("api_key", ["sk-not-a-key", None])
def test_a_wrong_or_missing_api_key_is_401(auth_gateway, api_key):
    # The client refuses to be made without a key: "missing" is a request it sends without
    # the Authorization header (openai.Omit).
    client = auth_gateway(api_key or "placeholder")
    extra = {"extra_headers": {"Authorization": openai.Omit()}} if api_key is None else {}
    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model="test-model", max_tokens=3,
                                       messages=[{"role": "user", "content": "hi"}], **extra)
    assert refused.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        client.models.list(**extra)
