"""PD with the prefix cache: a multi-turn chat through a gateway, a prefill engine and a decode
engine (tiny model, loopback) answers exactly as the same stack with the cache off, while the
prefill engine recomputes only each turn's new tokens; with prefix warming (--prefix-warm) the
prefill engine also holds each answer, so a later turn prefills little more than its new message."""
from __future__ import annotations

import httpx
import pytest

from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
from tests.integration.engine.helpers import engine_idle, engine_state, wait_for
from tests.support.metrics_text import metric_value

TURNS = ["Tell me a story about a fox who lives in the forest near the river.",
         "What happened next, when winter came?", "And how does it end?"]
ARGS = ("--kv-pages", "256", "--bootstrap-timeout", "10")


@pytest.fixture
def stacks(engine_launcher, tiny_engine_model, gateway_server):
    """Two gateways over one decode engine: one with a caching prefill engine, one without."""
    decode = engine_launcher(tiny_engine_model, "decode", ARGS)
    cached = engine_launcher(tiny_engine_model, "prefill", ARGS)
    plain = engine_launcher(tiny_engine_model, "prefill", (*ARGS, "--no-prefix-cache"))
    gateways = {name: gateway_server(StaticDiscovery(StaticSpec((pod.url,), (), (decode.url,)), poll_s=0.05))
                for name, pod in (("cached", cached), ("plain", plain))}
    return gateways, {"cached": cached, "plain": plain, "decode": decode}


def _converse(gateway_url: str, max_tokens: int = 12, between=None) -> tuple[list[str], list[int]]:
    messages, answers, cached = [], [], []
    with httpx.Client(timeout=60) as client:
        for i, turn in enumerate(TURNS):
            messages.append({"role": "user", "content": turn})
            reply = client.post(gateway_url + "/v1/chat/completions",
                                json={"messages": messages, "max_tokens": max_tokens, "temperature": 0})
            assert reply.status_code == 200, reply.text
            body = reply.json()
            answer = body["choices"][0]["message"]["content"]
            messages.append({"role": "assistant", "content": answer})
            answers.append(answer)
            cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
            if between is not None:
                between(i + 1)
    return answers, cached


def _counter(engine, name: str, **labels: str) -> float:
    return metric_value(httpx.get(engine.url + "/metrics", timeout=10).text, name, **labels)


def test_multi_turn_chat_gives_the_same_answers_with_and_without_the_cache(stacks):
    gateways, engines = stacks
    assert engine_state(engines["cached"])["prefix_cache"] is True
    assert engine_state(engines["plain"])["prefix_cache"] is False
    assert engine_state(engines["decode"])["prefix_cache"] is False  # decode engines keep none
    with_cache, cached_tokens = _converse(gateways["cached"].url)
    without, plain_tokens = _converse(gateways["plain"].url)
    assert with_cache == without
    # turn 1 found nothing; later turns found at least the earlier turns' full prompt pages,
    # and the decode engine (which answers the client) reports what the prefill engine found
    assert cached_tokens[0] == 0 and all(c >= 16 for c in cached_tokens[1:]), cached_tokens
    assert plain_tokens == [0] * len(TURNS)
    hit = _counter(engines["cached"], "laps_engine_prefix_cache_hit_tokens_total")
    assert hit == sum(cached_tokens)
    assert _counter(engines["plain"], "laps_engine_prefix_cache_hit_tokens_total") == 0
    lookups = _counter(engines["cached"], "laps_engine_prefix_cache_lookup_tokens_total")
    assert lookups == _counter(engines["plain"], "laps_engine_prefix_cache_lookup_tokens_total") > hit
    for engine in engines.values():
        wait_for(lambda engine=engine: engine_idle(engine), message="every engine to hold nothing")


def _metrics(engine) -> str:
    return httpx.get(engine.url + "/metrics", timeout=10).text


def test_mixed_engine_reports_cached_tokens_and_the_class_split(tiny_mixed_engine):
    engine = tiny_mixed_engine
    text = "a long shared system prompt that many requests start with, " * 4
    split = dict(gateway_class="long", engine_class="short")
    before = metric_value(_metrics(engine), "laps_engine_class_total", **split)
    with httpx.Client(timeout=60) as client:
        first = client.post(engine.url + "/generate", headers={"X-LAPS-Class": "long"}, json={
            "text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
        second = client.post(engine.url + "/v1/completions", json={
            "prompt": text + "and one more question", "max_tokens": 2, "temperature": 0})
        bad = client.post(engine.url + "/v1/completions", headers={"X-LAPS-Class": "medium"},
                          json={"prompt": "x"})
    assert first.status_code == 200 and second.status_code == 200, (first.text, second.text)
    prompt_tokens = first.json()["meta_info"]["prompt_tokens"]
    assert first.json()["meta_info"]["cached_tokens"] <= prompt_tokens
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16 * ((prompt_tokens - 16) // 16)  # its whole pages, up to the last (maybe shared) one
    assert bad.status_code == 400 and "X-LAPS-Class" in bad.json()["error"]["message"]
    # the gateway said long, this engine saw a short prefill (the prompt is ~60 tokens)
    assert metric_value(_metrics(engine), "laps_engine_class_total", **split) == before + 1


def test_warming_caches_each_answer_on_the_prefill_engine_without_changing_answers(
        engine_launcher, tiny_engine_model, gateway_server):
    def stack(warm: bool):
        flag = "--prefix-warm" if warm else "--no-prefix-warm"
        decode = engine_launcher(tiny_engine_model, "decode", (*ARGS, flag))
        prefill = engine_launcher(tiny_engine_model, "prefill", (*ARGS, flag))
        gateway = gateway_server(StaticDiscovery(StaticSpec((prefill.url,), (), (decode.url,)), poll_s=0.05),
                                 prefix_warm=warm)
        return gateway, prefill

    (warm_gw, warm_prefill), (cold_gw, _) = stack(True), stack(False)

    def warmed(turns: int) -> None:
        # Warms are fire-and-forget, computed when the prefill engine is idle: the next turn
        # is sent once this turn's answer is in (a client thinking, as users do).
        wait_for(lambda: _counter(warm_prefill, "laps_engine_prefix_warm_total", outcome="done") == turns,
                 message=f"the prefill engine to have warmed {turns} answers")

    answers, warm_cached = _converse(warm_gw.url, max_tokens=40, between=warmed)
    cold_answers, cold_cached = _converse(cold_gw.url, max_tokens=40)
    assert answers == cold_answers
    # Each later turn found the earlier prompt AND the answer cached: at least the answer's
    # whole pages (40 tokens: 2) more than without warming.
    for turn in range(1, len(TURNS)):
        assert warm_cached[turn] >= cold_cached[turn] + 32, (warm_cached, cold_cached)
    assert _counter(warm_prefill, "laps_engine_prefix_warm_tokens_total") >= 32 * len(TURNS)
