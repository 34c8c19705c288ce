"""Over stock SGLang (which reports no prompt limit in its load), a prompt longer than its
context, sent while its group is overloaded: the gateway asks each SGLang pod its context once,
and answers SGLang's own 400 at once, not a 429 that OpenAI's SDK resends for a prompt that can
never fit. Stub engines serve SGLang's routes in its shapes (tests/support/stub_sglang.py)."""
from __future__ import annotations

import threading

import httpx
import openai
import pytest

from tests.support.fixtures_gateway import RawRequest, poll
from tests.support.metrics_text import metric_value
from tests.support.refusals import admission_refusal

CONTEXT = 512    # SGLang refuses a prompt of 512 tokens or more
BOUND = 100      # pending tokens per pod: the held 300-token prompt overloads the long group


def _ids(n: int, token: int = 5) -> list[int]:
    return [token] * n   # token ids: counted exactly by the gateway, without a tokenizer


@pytest.fixture
def sglang_stack(gateway_server):
    """start(**server_args) -> (gateway, the long prefill's gate, the pods' StubSGLang apps)."""
    from laps_agent.gateway.discovery import StaticDiscovery, StaticSpec
    from laps_agent.serving import ServerThread
    from tests.support.stub_engine import KVHandoff, StubEngine
    from tests.support.stub_sglang import StubSGLang

    servers: list[ServerThread] = []

    def start(**server_args):
        handoff, gate = KVHandoff(), threading.Event()
        engines = [StubEngine("prefill", bootstrap_port=9001, handoff=handoff),
                   StubEngine("prefill", bootstrap_port=9002, handoff=handoff, prefill_gate=gate),
                   StubEngine("decode", handoff=handoff)]
        apps = [StubSGLang(e, context_len=CONTEXT, server_args=server_args) for e in engines]
        servers.extend(ServerThread(app).start() for app in apps)
        short, long_, decode = (s.url for s in servers[-3:])
        gateway = gateway_server(StaticDiscovery(StaticSpec((short,), (long_,), (decode,)), poll_s=0.05),
                                 length_threshold=64, max_pending_tokens_per_pod=BOUND,
                                 served_model_name="stub-model")
        return gateway, gate, apps

    yield start
    for server in servers:
        server.stop()


def _status(gateway) -> dict:
    return httpx.get(f"{gateway.url}/laps_status").json()


def test_a_prompt_over_sglangs_context_gets_its_400_not_a_retryable_429(sglang_stack):
    gateway, gate, _ = sglang_stack()
    held = RawRequest(gateway.url, "/v1/completions", {"prompt": _ids(300), "max_tokens": 1})
    try:
        poll(lambda: _status(gateway)["groups"]["long"]["pending_tokens"] >= BOUND,
             message="the long group overloaded")
        poll(lambda: _status(gateway)["max_prompt_tokens"] == CONTEXT - 1, message="SGLang's limit learnt")
        # The longest prompt SGLang takes is no 400: it meets admission, like any (other token:
        # one sharing the held prompt's prefix would be short work on its pod, cache affinity).
        fits = httpx.post(f"{gateway.url}/v1/completions",
                          json={"prompt": _ids(CONTEXT - 1, 7), "max_tokens": 1})
        admission_refusal(fits, "the long prefill group is overloaded")

        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")   # max_retries: 2
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="stub-model", prompt=_ids(CONTEXT), max_tokens=1)
        # SGLang's own words for that prompt (prompt_rules.sglang_over_context_message cites them).
        assert refused.value.body == {
            "message": "The input (512 tokens) is longer than the model's context length (512 tokens).",
            "type": "context_length_exceeded", "code": 400}
        metrics = httpx.get(f"{gateway.url}/metrics").text
        # Sent once, not resent: the SDK does not retry a 400; only the prompt that fits was a 429.
        assert metric_value(metrics, "laps_gateway_errors_total", reason="context_length_exceeded") == 1
        assert metric_value(metrics, "laps_gateway_rejected_total", **{"class": "long"}) == 1
        # A short prompt still goes through meanwhile.
        short = httpx.post(f"{gateway.url}/v1/completions",
                           json={"prompt": _ids(10, 9), "max_tokens": 1})
        assert short.status_code == 200, short.text
    finally:
        gate.set()
        held.hang_up()
    poll(lambda: _status(gateway)["groups"]["long"]["pending_tokens"] == 0, message="the long group drained")
    longest = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": _ids(CONTEXT - 1, 7), "max_tokens": 1})
    assert longest.status_code == 200, longest.text


def test_an_sglang_that_truncates_long_prompts_gets_them(sglang_stack):
    """With --allow-auto-truncate SGLang cuts an over-long prompt and serves it: the gateway,
    having read that in its server arguments, keeps no limit and refuses nothing by length."""
    gateway, gate, apps = sglang_stack(allow_auto_truncate=True)
    gate.set()
    poll(lambda: all(app.asked.get("/server_info") for app in apps), message="the pods asked their arguments")
    assert _status(gateway)["max_prompt_tokens"] is None
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": _ids(2 * CONTEXT), "max_tokens": 1})
    assert reply.status_code == 200, reply.text
