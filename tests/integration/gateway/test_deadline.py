"""The total request deadline (--request-deadline-s): a request still without its first byte
gets 504 naming the deadline; a stream already begun ends with an SSE error event; either way
the engines see the gateway hang up and stop working for it."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.support.fixtures_gateway import poll
from tests.support.metrics_text import metric_value


def _static(short=(), decode=()):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    return StaticDiscovery(StaticSpec(tuple(short), (), tuple(decode)), poll_s=0.05)


def test_a_request_over_its_deadline_before_the_first_byte_gets_504(stub_engines, gateway_server):
    prefill, prefill_engine = stub_engines("prefill", prefill_delay_s=30)
    decode, decode_engine = stub_engines("decode", first_token_delay_s=30)
    gateway = gateway_server(_static([prefill.url], [decode.url]), request_deadline_s=0.5)
    for stream in (False, True):
        started = time.monotonic()
        reply = httpx.post(f"{gateway.url}/v1/completions", timeout=10,
                           json={"prompt": "x", "max_tokens": 4, "stream": stream})
        took = time.monotonic() - started
        assert reply.status_code == 504, reply.text
        assert reply.json()["error"]["message"] == (
            "the request did not complete within its 0.5s deadline (the gateway's --request-deadline-s)")
        assert 0.5 <= took < 5
    poll(lambda: prefill_engine.disconnects == 2 and decode_engine.disconnects == 2,
         message="both engines to see both requests dropped")
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(metrics, "laps_gateway_errors_total", reason="deadline_exceeded") == 2
    assert httpx.get(f"{gateway.url}/laps_status").json()["groups"]["short"]["pending_requests"] == 0


def test_openai_clients_do_not_resend_a_request_that_ran_out_its_deadline(stub_engines, gateway_server):
    """OpenAI's SDKs resend any 5xx twice by default: a 504 deadline resent took three deadlines
    to reach the caller and made the engines do the work three times."""
    import openai

    prefill, prefill_engine = stub_engines("prefill", prefill_delay_s=30)
    decode, decode_engine = stub_engines("decode", first_token_delay_s=30)
    gateway = gateway_server(_static([prefill.url], [decode.url]), request_deadline_s=0.5)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")   # default retries
    with pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(model="default", prompt="x", max_tokens=4)
    assert caught.value.status_code == 504
    assert "within its 0.5s deadline" in caught.value.message
    assert len(prefill_engine.requests) == 1 and len(decode_engine.requests) == 1   # sent once
    assert caught.value.response.headers["x-should-retry"] == "false"
    poll(lambda: prefill_engine.disconnects == 1 and decode_engine.disconnects == 1,
         message="both engines to see the request dropped")


def test_a_stream_over_its_deadline_ends_with_an_error_event(stub_engines, gateway_server):
    prefill, _ = stub_engines("prefill")
    decode, decode_engine = stub_engines("decode", token_delay_s=0.2)  # 16 tokens: 3.2 s
    gateway = gateway_server(_static([prefill.url], [decode.url]), request_deadline_s=1.0)
    started = time.monotonic()
    with httpx.stream("POST", f"{gateway.url}/v1/completions", timeout=10,
                      json={"prompt": "x", "max_tokens": 16, "stream": True}) as reply:
        assert reply.status_code == 200
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert time.monotonic() - started < 3
    tokens, last = events[:-1], json.loads(events[-1])
    assert tokens and all(json.loads(e)["choices"] for e in tokens)  # what came in time came
    assert last["error"]["type"] == "deadline_exceeded"
    assert "within its 1s deadline" in last["error"]["message"]
    poll(lambda: decode_engine.disconnects == 1, message="the decode engine to see the hang-up")
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(metrics, "laps_gateway_errors_total", reason="deadline_exceeded") == 1


def test_the_deadline_error_event_parses_even_when_it_strikes_mid_event(stub_engines, gateway_server):
    """An engine's event can span two reads. The deadline's event used to be glued to the half
    already relayed, and OpenAI's SDK then raised a JSON parse error instead of the reason."""
    import openai

    prefill, _ = stub_engines("prefill")
    decode, _ = stub_engines("decode", token_delay_s=0.2, split_events=True)  # mid-event ~always
    gateway = gateway_server(_static([prefill.url], [decode.url]), request_deadline_s=1.0)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    texts = []
    with pytest.raises(openai.APIError, match="within its 1s deadline"):
        for chunk in client.completions.create(model="default", prompt="x", max_tokens=16, stream=True):
            texts.append(chunk.choices[0].text)
    assert texts and {t.strip() for t in texts} == {"ok"}  # the whole events that came in time


def test_requests_within_the_deadline_are_untouched(stub_engines, gateway_server):
    prefill, _ = stub_engines("prefill")
    decode, _ = stub_engines("decode", token_delay_s=0.01)
    gateway = gateway_server(_static([prefill.url], [decode.url]), request_deadline_s=5.0)
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "x", "max_tokens": 4})
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == "ok ok ok ok"
    with httpx.stream("POST", f"{gateway.url}/v1/completions",
                      json={"prompt": "x", "max_tokens": 4, "stream": True}) as stream:
        events = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 5


def test_an_engine_that_stops_answering_gets_504_after_the_read_timeout(stub_engines, gateway_server):
    """Apart from the total deadline: no byte from a pod for --read-timeout-s ends the request."""
    from laps_agent.gateway.config import ProxyConfig

    prefill, _ = stub_engines("prefill", prefill_delay_s=30)
    decode, _ = stub_engines("decode", first_token_delay_s=30)
    gateway = gateway_server(_static([prefill.url], [decode.url]), request_deadline_s=0,
                             proxy=ProxyConfig(read_timeout_s=0.5, max_retries=0))
    started = time.monotonic()
    reply = httpx.post(f"{gateway.url}/v1/completions", timeout=10,
                       json={"prompt": "x", "max_tokens": 4})
    assert reply.status_code == 504, reply.text
    message = reply.json()["error"]["message"]
    assert message.startswith("timed out waiting for ") and message.endswith("no data for 0.5s"), message
    assert 0.5 <= time.monotonic() - started < 5
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(metrics, "laps_gateway_errors_total", reason="upstream_timeout") == 1
