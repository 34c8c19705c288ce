"""What clients other than the spec's send the gateway: nulls for unset fields, compressed bodies,
HEAD probes, OpenAI's retrieve-model call, a body that stops short of its Content-Length."""
from __future__ import annotations

import gzip
import json

import httpx
import openai
import pytest

from tests.support.fixtures_gateway import RawRequest, stalled_body_message


def test_stream_null_is_not_streamed(pd_stack):
    """OpenAI's schema has `stream: boolean | null`; typed clients send the null."""
    gateway, engines = pd_stack()
    for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 2}),
                       ("/generate", {"text": "hi"})):
        reply = httpx.post(gateway.url + path, json={**body, "stream": None})
        assert reply.status_code == 200, (path, reply.text)
        assert reply.headers["content-type"].startswith("application/json")
        assert reply.json()
    assert len(engines["decode"].requests) == 3


def test_a_compressed_body_is_415_naming_the_encoding(pd_stack):
    gateway, engines = pd_stack()
    raw = gzip.compress(json.dumps({"prompt": "hi"}).encode())
    reply = httpx.post(f"{gateway.url}/v1/completions", content=raw,
                       headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert reply.status_code == 415, reply.text
    assert "Content-Encoding 'gzip' is not supported" in reply.json()["error"]["message"]
    assert not engines["decode"].requests
    plain = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"},
                       headers={"content-encoding": "identity"})
    assert plain.status_code == 200, plain.text


@pytest.mark.parametrize("path", ["/health", "/live", "/v1/models"])
def test_head_probes_answer_as_get(pd_stack, path):
    gateway, _ = pd_stack()
    reply = httpx.head(gateway.url + path)
    assert reply.status_code == httpx.get(gateway.url + path).status_code == 200
    assert reply.content == b""


def test_the_openai_client_retrieves_the_served_model(pd_stack):
    gateway, _ = pd_stack()
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    model = client.models.retrieve("stub-model")
    assert (model.id, model.object) == ("stub-model", "model")
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4o")
    assert "'gpt-4o' is not served here" in caught.value.body["message"]


def test_a_body_that_stops_arriving_is_408_and_the_gateway_serves_on(pd_stack):
    """A body shorter than its Content-Length (a broken proxy or client) held the request until
    the deadline (600 s by default), then got a 504 blaming the gateway; with no deadline,
    forever. Now: 408 naming what came, the connection closed, the others served meanwhile."""
    gateway, engines = pd_stack(body_idle_timeout_s=0.5)
    stalled = RawRequest(gateway.url, "/v1/completions", {"prompt": "hi " * 50}, sent=20)
    ok = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"})
    assert ok.status_code == 200, ok.text
    message = stalled_body_message(*stalled.answer_to_eof())   # after 0.5 s, then closed
    assert "stopped arriving: 20 bytes of the" in message and "nothing for 0.5s" in message
    assert len(engines["decode"].requests) == 1   # the stalled one reached no engine
