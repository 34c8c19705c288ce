"""Over stock SGLang (which reports no prompt limit in its load), a prompt longer than its
context, sent while its group is overloaded: the gateway asks each SGLang pod its context once,
and answers SGLang's own 400 at once, not a 429 that OpenAI's SDK resends for a prompt that can
never fit. Stub engines serve SGLang's routes in its shapes (tests/support/stub_sglang.py)."""
from __future__ import annotations

import logging
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
    """start(answers=None, per_pod=None, **server_args) -> (gateway, the long prefill's gate,
    the pods' StubSGLang apps: short prefill, long prefill, decode). `answers`: each pod's
    StubSGLang.answers from the start; `per_pod`: server arguments of each pod, over
    `server_args`."""
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
    from laps_agent.serving.listen import ServerThread
    from tests.support.stub_engine import KVHandoff, StubEngine
    from tests.support.stub_sglang import StubSGLang

    servers: list[ServerThread] = []

    def start(answers=None, per_pod=({}, {}, {}), **server_args):
        handoff, gate = KVHandoff(), threading.Event()
        engines = [StubEngine("prefill", bootstrap_port=9001, handoff=handoff),
                   StubEngine("prefill", bootstrap_port=9002, handoff=handoff, prefill_gate=gate),
                   StubEngine("decode", handoff=handoff)]
        apps = [StubSGLang(e, context_len=CONTEXT, server_args={**server_args, **own})
                for e, own in zip(engines, per_pod)]
        for app in apps:
            app.answers.update(answers or {})
        servers.extend(ServerThread(app).start() for app in apps)
        short, long_, decode = (s.url for s in servers[-3:])
        gateway = gateway_server(StaticDiscovery(StaticSpec((short,), (long_,), (decode,)), poll_s=0.05),
                                 length_threshold=64, max_pending_tokens_per_pod=BOUND,
                                 served_model_name="stub-model",
                                 # each class in its own group: one held prompt overloads the long
                                 # one (the predicted router would send long work to the idle short pod)
                                 router="least-loaded")
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


def _said(caplog, text: str) -> list[str]:
    """The gateway's lines about SGLang's limits that contain `text`."""
    return [r.getMessage() for r in caplog.records
            if r.name == "laps_agent.gateway.proxy.sglang_limit" and text in r.getMessage()]


def test_an_sglang_that_truncates_long_prompts_gets_them(sglang_stack, caplog):
    """With --allow-auto-truncate SGLang cuts an over-long prompt and serves it: the gateway,
    having read that in its server arguments, refuses nothing by length."""
    caplog.set_level(logging.INFO, logger="laps_agent.gateway.proxy.sglang_limit")
    gateway, gate, apps = sglang_stack(allow_auto_truncate=True)
    gate.set()
    # Learnt (not merely not yet asked, which looks the same in /laps_status): each pod said so.
    poll(lambda: len(_said(caplog, "takes prompts of any number of tokens")) == 3,
         message="the gateway learnt that every pod takes any length")
    assert all(app.asked.get("/server_info") == 1 for app in apps)
    assert _status(gateway)["max_prompt_tokens"] is None
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": _ids(2 * CONTEXT), "max_tokens": 1})
    assert reply.status_code == 200, reply.text


def test_a_rollout_adding_auto_truncation_refuses_nothing_by_length(sglang_stack, caplog):
    """Mid-rollout the short prefill pod still refuses prompts of its context or more, while the
    new long prefill and decode pods truncate them: the new pods would serve a long prompt, so
    the old pod's limit must not refuse it at the gateway."""
    caplog.set_level(logging.INFO, logger="laps_agent.gateway.proxy.sglang_limit")
    truncates = {"allow_auto_truncate": True}
    gateway, gate, _ = sglang_stack(per_pod=({}, truncates, truncates))
    gate.set()
    poll(lambda: len(_said(caplog, "SGLang pod")) == 3, message="every pod answered")
    assert len(_said(caplog, f"at most {CONTEXT - 1} tokens")) == 1
    assert _status(gateway)["max_prompt_tokens"] is None
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": _ids(2 * CONTEXT), "max_tokens": 1})
    assert reply.status_code == 200, reply.text


def test_an_sglang_restarted_with_another_context_is_asked_again(sglang_stack):
    """Static discovery: an SGLang restarted with another --context-length comes back at the
    same address; the gateway learns its new limit instead of keeping the old one."""
    gateway, gate, apps = sglang_stack()
    gate.set()
    poll(lambda: _status(gateway)["max_prompt_tokens"] == CONTEXT - 1, message="SGLang's limit learnt")
    for app in apps:   # down (a real one refuses connections meanwhile), back with twice the context
        app.context_len = 2 * CONTEXT
        app.answers["/v1/loads"] = (503, b"{}")
    polled = [app.asked.get("/v1/loads", 0) for app in apps]
    poll(lambda: all(app.asked.get("/v1/loads", 0) > n for app, n in zip(apps, polled)),
         message="a load poll of each pod failed")
    for app in apps:
        del app.answers["/v1/loads"]
    poll(lambda: _status(gateway)["max_prompt_tokens"] == 2 * CONTEXT - 1, message="the new limit learnt")
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": _ids(CONTEXT), "max_tokens": 1})
    assert reply.status_code == 200, reply.text


def test_a_server_whose_answers_break_the_reading_is_asked_once(sglang_stack, caplog):
    """A /v1/models answer that breaks the reading in a way no SGLang's would (JSON nested past
    Python's recursion limit): the pod's limit is left to it, said once, not asked again on
    every load poll."""
    caplog.set_level(logging.INFO, logger="laps_agent.gateway.proxy.sglang_limit")
    gateway, gate, apps = sglang_stack(answers={"/v1/models": (200, b"[" * 100_000)})
    gate.set()
    poll(lambda: len(_said(caplog, "its prompt limit is left to it")) == 3, message="every pod's limit left to it")
    polled = [app.asked["/v1/loads"] for app in apps]
    poll(lambda: all(app.asked["/v1/loads"] >= n + 3 for app, n in zip(apps, polled)),
         message="three more load polls of each pod")
    assert [app.asked["/v1/models"] for app in apps] == [1, 1, 1]
    assert len(_said(caplog, "its prompt limit is left to it")) == 3
    assert _status(gateway)["max_prompt_tokens"] is None


def test_a_server_without_sglangs_server_info_is_not_asked_again_and_again(sglang_stack, caplog):
    """Neither /server_info nor /get_server_info (404): not SGLang's answers, so its limit is
    left to it, for good, rather than asked again every 30 s with a line each time."""
    caplog.set_level(logging.INFO, logger="laps_agent.gateway.proxy.sglang_limit")
    # Their load route held down until every pod is discovered: discovery reads /get_server_info.
    gateway, gate, apps = sglang_stack(answers={"/v1/loads": (503, b"{}")})
    gate.set()
    poll(lambda: sum(map(len, gateway.gateway.discovery.membership().groups.values())) == 2,
         message="both prefill pods discovered")
    for app in apps:
        app.answers.update({"/server_info": (404, b'{"detail": "Not Found"}'),
                            "/get_server_info": (404, b'{"detail": "Not Found"}')})
        del app.answers["/v1/loads"]
    poll(lambda: len(_said(caplog, "its prompt limit is left to it")) == 3, message="every pod's limit left to it")
    assert _said(caplog, "asked again") == []
    assert [app.asked["/server_info"] for app in apps] == [1, 1, 1]
    assert _status(gateway)["max_prompt_tokens"] is None
