"""Bad input gets a clear 4xx and loses nothing; departing clients free their KV."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.integration.engine.helpers import client_disconnects, engine_idle, engine_state, wait_for

BAD = [
    ("/generate", b'{"text": "hi", "sampling_params": {', "malformed JSON"),
    ("/generate", b'[1, 2]', "JSON object"),
    ("/generate", b'{"sampling_params": {}}', "exactly one of"),
    ("/generate", b'{"text": ""}', "empty"),
    ("/generate", b'{"input_ids": []}', "empty"),
    ("/generate", b'{"input_ids": [1, "x"]}', "input_ids"),
    ("/generate", b'{"input_ids": [99999999]}', "input_ids must be in"),
    ("/generate", b'{"text": "hi", "sampling_params": {"temperature": -1}}', "temperature"),
    ("/generate", b'{"text": "hi", "sampling_params": {"top_p": 0}}', "top_p"),
    ("/generate", b'{"text": "hi", "sampling_params": {"max_new_tokens": 0}}', "max_new_tokens"),
    ("/generate", b'{"text": "hi", "sampling_params": {"top_k": "many"}}', "top_k"),
    ("/generate", b'{"text": "hi", "stream": "yes"}', "stream"),
    ("/v1/completions", b'{"prompt": "hi", "n": 3}', "n=1"),
    ("/v1/completions", b'{"prompt": "hi", "logprobs": 1}', "logprobs=1 is not implemented"),
    ("/v1/completions", b'{"prompt": "hi", "logprobs": 0}', "logprobs=0 is not implemented"),
    ("/v1/completions", b'{"prompt": "hi", "echo": true}', "echo=True is not implemented"),
    ("/v1/completions", b'{"prompt": "hi", "presence_penalty": 0.5}', "presence_penalty"),
    ("/v1/completions", b'{"prompt": ["one", "two"]}', "batched prompts (2 in one request)"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "logprobs": true}', "logprobs"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
                             b'"tools": [{"type": "function", "function": {"name": "f"}}]}', "tools"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
                             b'"response_format": {"type": "json_object"}}', "response_format"),
    ("/v1/completions", b'{"prompt": {"a": 1}}', "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "stop": 5}', "stop"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2.5}', "max_tokens must be an integer"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"content": "no role"}]}', "role"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 7}]}', "content"),
    # SGLang's /generate fields the engine does not implement were silently ignored: `n: 2` got
    # one sample, a regex or penalty did not apply, return_logprob gave no logprobs.
    ("/generate", b'{"input_ids": [[1, 2], [3]]}', "batched input_ids (2 prompts in one request)"),
    ("/generate", b'{"text": "hi", "sampling_params": {"n": 2}}', "sampling_params.n=2 is not implemented"),
    ("/generate", b'{"text": "hi", "sampling_params": {"min_p": 0.2}}', "sampling_params.min_p=0.2"),
    ("/generate", b'{"text": "hi", "sampling_params": {"regex": "[0-9]+"}}', "sampling_params.regex"),
    ("/generate", b'{"text": "hi", "sampling_params": {"repetition_penalty": 1.2}}', "repetition_penalty"),
    ("/generate", b'{"text": "hi", "sampling_params": {"min_new_tokens": 5}}', "min_new_tokens"),
    ("/generate", b'{"text": "hi", "sampling_params": {"skip_special_tokens": false}}', "skip_special_tokens"),
    ("/generate", b'{"text": "hi", "return_logprob": true}', "return_logprob=True is not implemented"),
    ("/generate", b'{"text": "hi", "lora_path": "adapter"}', "lora_path"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
                             b'"skip_special_tokens": false}', "skip_special_tokens"),
    # Wrong types were read as something else: "false" as true, a dict's keys as stop strings.
    ("/generate", b'{"text": "hi", "sampling_params": {"ignore_eos": "false"}}', "ignore_eos must be a boolean"),
    ("/v1/completions", b'{"prompt": "hi", "ignore_eos": 1}', "ignore_eos must be a boolean"),
    ("/generate", b'{"text": "hi", "sampling_params": {"stop": {"a": 1}}}', "stop must be a string or a list"),
    ("/generate", b'{"text": "hi", "sampling_params": {"stop_token_ids": 5}}', "stop_token_ids must be a list"),
    ("/generate", b'{"text": "hi", "sampling_params": {"temperature": true}}', "temperature must be a number"),
    ("/v1/completions", b'{"prompt": "hi", "n": true}', "only n=1 is supported, got n=True"),
]


@pytest.mark.parametrize("path,raw,needle", BAD)
def test_bad_input_is_a_clear_4xx(tiny_mixed_engine, path, raw, needle):
    resp = httpx.post(tiny_mixed_engine.url + path, content=raw, headers={"content-type": "application/json"})
    assert 400 <= resp.status_code < 500, resp.text
    err = resp.json()["error"]
    assert needle in err["message"] and err["type"]


def test_fields_that_ask_for_nothing_are_served(tiny_mixed_engine):
    """What clients send by default for the fields the engine does not implement passes."""
    body = {"prompt": "hi", "max_tokens": 2, "logprobs": None, "echo": False, "best_of": 1,
            "presence_penalty": 0.0, "frequency_penalty": 0, "logit_bias": {}, "suffix": None}
    resp = httpx.post(tiny_mixed_engine.url + "/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": False,
            "tool_choice": "none", "tools": [], "response_format": {"type": "text"}, "top_logprobs": 0}
    resp = httpx.post(tiny_mixed_engine.url + "/v1/chat/completions", json=chat, timeout=60)
    assert resp.status_code == 200, resp.text
    generate = {"text": "hi", "return_logprob": False, "lora_path": None, "image_data": None,
                "sampling_params": {"max_new_tokens": 2, "n": 1, "min_p": 0.0, "repetition_penalty": 1,
                                    "skip_special_tokens": True, "no_stop_trim": False, "stop_regex": [],
                                    "json_schema": None, "stream_interval": 4, "ignore_eos": None}}
    resp = httpx.post(tiny_mixed_engine.url + "/generate", json=generate, timeout=60)
    assert resp.status_code == 200, resp.text


def test_over_context_prompt_is_rejected_and_engine_keeps_serving(tiny_mixed_engine):
    limit = engine_state(tiny_mixed_engine)["max_prompt_tokens"]
    resp = httpx.post(tiny_mixed_engine.url + "/generate", json={"input_ids": [5] * (limit + 1)})
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "context_length_exceeded"
    # A prompt as long as the context leaves no room for one token: the 400 says so, as SGLang's.
    assert resp.json()["error"]["message"] == (
        f"the prompt has {limit + 1} tokens; this engine takes at most {limit}: prompt + completion "
        f"must fit in its context of {limit + 1} tokens")
    ok = httpx.post(tiny_mixed_engine.url + "/generate",
                    json={"text": "still alive?", "sampling_params": {"max_new_tokens": 3}}, timeout=60)
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 3
    wait_for(lambda: engine_idle(tiny_mixed_engine), message="engine idle")


def test_usage_never_passes_the_context(tiny_mixed_engine):
    """As OpenAI, vLLM and SGLang: an answer stops when prompt + completion reach the context
    (finish_reason "length"); a prompt one token short of it got 2 tokens, one past it."""
    context = engine_state(tiny_mixed_engine)["context_length"]
    assert engine_state(tiny_mixed_engine)["max_prompt_tokens"] == context - 1
    for short in (1, 3):
        ids = [40 + i % 200 for i in range(context - short)]
        resp = httpx.post(tiny_mixed_engine.url + "/v1/completions", timeout=120,
                          json={"prompt": ids, "max_tokens": 50, "temperature": 0, "ignore_eos": True})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["usage"] == {**body["usage"], "prompt_tokens": context - short, "completion_tokens": short,
                                 "total_tokens": context}
        assert body["choices"][0]["finish_reason"] == "length"
    wait_for(lambda: engine_idle(tiny_mixed_engine), message="engine idle")


async def test_disconnecting_streaming_client_frees_its_kv(tiny_mixed_engine):
    body = {"text": "tell me a very long story", "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0}}
    gone = client_disconnects(tiny_mixed_engine)
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", tiny_mixed_engine.url + "/generate", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    break  # got the first token: the request holds KV now
            holding = engine_state(tiny_mixed_engine)["state"]
            assert holding["live"] == 1 and holding["kv_usage"] > 0
        # leaving the block closes the connection mid-stream
    await asyncio.to_thread(wait_for, lambda: engine_idle(tiny_mixed_engine), 20.0, "KV freed after disconnect")
    await asyncio.to_thread(wait_for, lambda: client_disconnects(tiny_mixed_engine) == gone + 1, 20.0,
                            "the hang-up counted in laps_engine_client_disconnects_total")


async def test_disconnecting_non_streaming_client_frees_its_kv(tiny_mixed_engine):
    body = {"text": "another long story", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    gone = client_disconnects(tiny_mixed_engine)
    async with httpx.AsyncClient(timeout=60) as client:
        task = asyncio.create_task(client.post(tiny_mixed_engine.url + "/generate", json=body))
        await asyncio.to_thread(wait_for, lambda: engine_state(tiny_mixed_engine)["state"]["running"] == 1,
                                20.0, "request decoding")
        task.cancel()  # the client gives up: its connection closes
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.to_thread(wait_for, lambda: engine_idle(tiny_mixed_engine), 20.0, "KV freed after disconnect")
    await asyncio.to_thread(wait_for, lambda: client_disconnects(tiny_mixed_engine) == gone + 1, 20.0,
                            "the hang-up counted in laps_engine_client_disconnects_total")
