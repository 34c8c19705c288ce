"""Bad requests get a clear 4xx (or 503 + Retry-After) and never reach an engine."""
from __future__ import annotations

import httpx
import pytest


@pytest.fixture
def stack(pd_stack):
    return pd_stack(max_body_bytes=4096)


def _error(reply: httpx.Response, status: int) -> str:
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]["message"]
    assert message
    return message


def test_malformed_json_is_400(stack):
    gateway, engines = stack
    reply = httpx.post(f"{gateway.url}/v1/completions", content=b"{not json",
                       headers={"content-type": "application/json"})
    assert "not valid JSON" in _error(reply, 400)
    reply = httpx.post(f"{gateway.url}/v1/completions", json=["a list"])
    assert "JSON object" in _error(reply, 400)
    deep = b"[" * 1020 + b"]" * 1020  # deeper than Python's JSON decoder recurses
    reply = httpx.post(f"{gateway.url}/v1/completions", content=deep,
                       headers={"content-type": "application/json"})
    _error(reply, 400)
    assert not engines["decode"].requests


@pytest.mark.parametrize("path, body, mentions", [
    ("/v1/completions", {"model": "stub-model"}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}], "stream": "yes please"}, "stream"),
    ("/generate", {"sampling_params": {}}, "text"),
    # Several samples per request: SGLang's PD servers never answered them.
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, "n=2 is not supported"),
    ("/generate", {"text": "x", "sampling_params": {"n": 4}}, "n=4 is not supported"),
])
def test_missing_or_wrong_fields_are_400_naming_the_field(stack, path, body, mentions):
    gateway, engines = stack   # 400, as OpenAI and SGLang answer them (not FastAPI's 422)
    assert mentions in _error(httpx.post(gateway.url + path, json=body), 400)
    assert not engines["decode"].requests


@pytest.mark.parametrize("field, literal", [("temperature", "NaN"), ("temperature", "1e999"), ("top_p", "Infinity")])
def test_a_nan_or_infinite_sampling_value_is_400_saying_so(stack, field, literal):
    """Python's JSON reader takes these (NaN and Infinity are not even JSON): a NaN was said to
    be "below 0", an infinite temperature passed to the engine."""
    gateway, engines = stack
    body = b'{"prompt": "x", "%s": %s}' % (field.encode(), literal.encode())
    reply = httpx.post(f"{gateway.url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert f"{field}: Input should be a finite number" in _error(reply, 400)
    assert not engines["decode"].requests


def test_body_over_the_limit_is_413(stack):
    gateway, engines = stack
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x" * 9000})
    assert "limit" in _error(reply, 413)

    def chunked():  # no content-length: the limit must hold while reading too
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"x" * 500
        yield b'"}'

    reply = httpx.post(f"{gateway.url}/v1/completions", content=chunked(),
                       headers={"content-type": "application/json"})
    _error(reply, 413)
    assert not engines["decode"].requests


def test_token_ids_outside_the_vocabulary_are_400(pd_stack, smollm2_tokenizer):
    """SGLang does not check them, and one such id crashed its prefill server."""
    from laps_agent.gateway.estimate import TokenEstimator

    gateway, engines = pd_stack(estimator=TokenEstimator(smollm2_tokenizer))
    vocab = smollm2_tokenizer.vocab_size
    for path, body, bad in (("/v1/completions", {"prompt": [1, -1]}, -1),
                            ("/v1/completions", {"prompt": [[1], [vocab]]}, vocab),
                            ("/generate", {"input_ids": [5, vocab + 7]}, vocab + 7)):
        message = _error(httpx.post(gateway.url + path, json=body), 400)
        assert f"token id {bad}" in message and f"0..{vocab - 1}" in message
    assert not engines["decode"].requests
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": [0, vocab - 1], "max_tokens": 2})
    assert reply.status_code == 200, reply.text


def test_unknown_model_is_404(stack):
    gateway, _ = stack
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert "gpt-9" in _error(reply, 404)


def test_no_healthy_pods_is_503_with_retry_after(gateway_server):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    # Nothing listens on these ports, so discovery never admits them.
    spec = StaticSpec(("http://127.0.0.1:9",), (), ("http://127.0.0.1:9",))
    gateway = gateway_server(StaticDiscovery(spec), wait_ready=False)
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x"})
    _error(reply, 503)
    assert int(reply.headers["retry-after"]) >= 1
    assert httpx.get(f"{gateway.url}/health").json()["ready"] is False
