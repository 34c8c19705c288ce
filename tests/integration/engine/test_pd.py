"""Two real engines on loopback (prefill + decode, tiny model) speaking the SGLang PD protocol."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.integration.engine.helpers import engine_idle, engine_state, pd_body, room, sse_events, wait_for

GREEDY = {"text": "The quick brown fox jumps over", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}


async def _pd(pd, body: dict, path: str = "/generate", *, stream: bool = False):
    r = room()
    body = pd_body({**body, "stream": stream}, pd.prefill, r)
    async with httpx.AsyncClient(timeout=60) as client:
        pre, dec = await asyncio.gather(client.post(pd.prefill.url + path, json=body),
                                        client.post(pd.decode.url + path, json=body))
    return pre, dec


async def test_pd_answer_equals_mixed_answer(tiny_pd_engines, tiny_mixed_engine):
    pre, dec = await _pd(tiny_pd_engines, GREEDY)
    assert pre.status_code == 200, pre.text
    assert dec.status_code == 200, dec.text
    async with httpx.AsyncClient(timeout=60) as client:
        mixed = (await client.post(tiny_mixed_engine.url + "/generate", json=GREEDY)).json()
    answer = dec.json()
    assert answer["output_ids"] == mixed["output_ids"]
    assert answer["text"] == mixed["text"]
    assert answer["meta_info"]["completion_tokens"] == 12
    # the prefill engine computed exactly the first token the decode engine answered with
    assert pre.json()["output_ids"] == mixed["output_ids"][:1]
    wait_for(lambda: engine_idle(tiny_pd_engines.prefill) and engine_idle(tiny_pd_engines.decode),
             message="both PD engines to free everything")


async def test_pd_streaming_chat_matches_mixed(tiny_pd_engines, tiny_mixed_engine):
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 10, "temperature": 0}
    pre, dec = await _pd(tiny_pd_engines, body, "/v1/chat/completions", stream=True)
    assert pre.status_code == 200 and dec.status_code == 200, (pre.text, dec.text)
    assert dec.headers["content-type"].startswith("text/event-stream")
    events = sse_events(dec.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    async with httpx.AsyncClient(timeout=60) as client:
        mixed = (await client.post(tiny_mixed_engine.url + "/v1/chat/completions", json=body)).json()
    assert streamed == mixed["choices"][0]["message"]["content"]


async def test_pd_seeded_sampling_matches_mixed(tiny_pd_engines, tiny_mixed_engine):
    body = {"prompt": "once upon a time", "max_tokens": 10, "temperature": 0.9, "top_p": 0.9, "seed": 1234}
    pre, dec = await _pd(tiny_pd_engines, body, "/v1/completions")
    assert dec.status_code == 200, dec.text
    async with httpx.AsyncClient(timeout=60) as client:
        mixed = (await client.post(tiny_mixed_engine.url + "/v1/completions", json=body)).json()
    assert dec.json()["choices"][0]["text"] == mixed["choices"][0]["text"]


async def test_pd_usage_never_passes_the_context(tiny_pd_engines):
    """The decode engine stops where a mixed one does: prompt + completion == the context. A
    prompt one token short of it gets the prefill engine's first token alone (the decode engine
    used to decode one more, past the context)."""
    context = engine_state(tiny_pd_engines.decode)["context_length"]
    for short in (1, 3):
        ids = [60 + i % 200 for i in range(context - short)]
        pre, dec = await _pd(tiny_pd_engines, {"prompt": ids, "max_tokens": 50, "temperature": 0,
                                               "ignore_eos": True}, "/v1/completions")
        assert pre.status_code == 200 and dec.status_code == 200, (pre.text, dec.text)
        usage = dec.json()["usage"]
        assert (usage["completion_tokens"], usage["total_tokens"]) == (short, context)
        assert dec.json()["choices"][0]["finish_reason"] == "length"
    wait_for(lambda: engine_idle(tiny_pd_engines.prefill) and engine_idle(tiny_pd_engines.decode),
             message="both PD engines to free everything")


@pytest.mark.parametrize("first", ["decode", "prefill"])
async def test_pd_either_side_may_arrive_first(tiny_pd_engines, tiny_mixed_engine, first):
    pd = tiny_pd_engines
    r = room()
    body = pd_body(GREEDY, pd.prefill, r)
    async with httpx.AsyncClient(timeout=60) as client:
        if first == "decode":
            dec_task = asyncio.create_task(client.post(pd.decode.url + "/generate", json=body))
            await asyncio.to_thread(wait_for, lambda: engine_state(pd.decode)["bootstrap"]["fetching"] == 1,
                                    message="decode engine polling for its room")
            pre = await client.post(pd.prefill.url + "/generate", json=body)
            dec = await dec_task
        else:
            pre_task = asyncio.create_task(client.post(pd.prefill.url + "/generate", json=body))
            await asyncio.to_thread(wait_for, lambda: engine_state(pd.prefill)["bootstrap"]["pending_rooms"] == 1,
                                    message="prefill engine parking its room")
            dec = await client.post(pd.decode.url + "/generate", json=body)
            pre = await pre_task
        mixed = (await client.post(tiny_mixed_engine.url + "/generate", json=GREEDY)).json()
    assert pre.status_code == 200 and dec.status_code == 200, (pre.text, dec.text)
    assert dec.json()["output_ids"] == mixed["output_ids"]


async def test_room_that_never_arrives_times_out_cleanly(tiny_pd_engines):
    pd = tiny_pd_engines
    timeout = engine_state(pd.decode)["bootstrap_timeout_s"]
    body = pd_body(GREEDY, pd.prefill, room())
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=60) as client:
        dec, pre = await asyncio.gather(
            # decode side: the prefill engine never receives this room
            client.post(pd.decode.url + "/generate", json=body),
            # prefill side: no decode engine ever collects this one
            client.post(pd.prefill.url + "/generate", json=pd_body(GREEDY, pd.prefill, room())))
    assert time.monotonic() - started < 2 * timeout + 20
    for resp in (dec, pre):
        assert resp.status_code == 504, resp.text
        err = resp.json()["error"]
        assert err["type"] == "bootstrap_error"
        assert "bootstrap_room" in err["message"]
    wait_for(lambda: engine_idle(pd.prefill) and engine_idle(pd.decode), message="both sides freed")
    # and both engines still serve
    pre, dec = await _pd(pd, GREEDY)
    assert dec.status_code == 200, dec.text


async def test_decode_engine_requires_bootstrap_fields(tiny_pd_engines):
    async with httpx.AsyncClient(timeout=30) as client:
        resp = await client.post(tiny_pd_engines.decode.url + "/generate", json=GREEDY)
        partial = await client.post(tiny_pd_engines.decode.url + "/generate",
                                    json={**GREEDY, "bootstrap_room": 5})
    assert resp.status_code == 400 and "bootstrap" in resp.json()["error"]["message"]
    assert partial.status_code == 400 and "bootstrap_host" in partial.json()["error"]["message"]


def test_prefill_engine_reports_its_bootstrap_port(tiny_pd_engines):
    info = engine_state(tiny_pd_engines.prefill)
    assert info["role"] == "prefill"
    assert info["bootstrap_port"] == tiny_pd_engines.prefill.bootstrap_port
    assert engine_state(tiny_pd_engines.decode)["bootstrap_port"] is None


async def test_many_concurrent_pd_requests_all_complete_and_free_everything(tiny_pd_engines):
    pd = tiny_pd_engines
    bodies = [{"text": f"request number {i} " * (1 + i), "sampling_params": {"max_new_tokens": 6 + i,
               "ignore_eos": True}, "stream": i % 2 == 1} for i in range(6)]
    async with httpx.AsyncClient(timeout=60) as client:
        calls = []
        for body in bodies:
            b = pd_body(body, pd.prefill, room())
            calls += [client.post(pd.prefill.url + "/generate", json=b), client.post(pd.decode.url + "/generate", json=b)]
        responses = await asyncio.gather(*calls)
    for i, body in enumerate(bodies):
        pre, dec = responses[2 * i], responses[2 * i + 1]
        assert pre.status_code == 200 and dec.status_code == 200, (pre.text, dec.text)
        final = sse_events(dec.text)[-2] if body["stream"] else dec.json()
        assert final["meta_info"]["completion_tokens"] == 6 + i
        assert final["meta_info"]["finish_reason"]["type"] == "length"
    wait_for(lambda: engine_idle(pd.prefill) and engine_idle(pd.decode), message="both PD engines idle")
