"""OpenAI request fields as real clients send them: nulls for every field left unset, the newer
names, non-text content parts, numbers JSON can write but Python cannot make an int of."""
from __future__ import annotations

import httpx
import pytest

CHAT = "/v1/chat/completions"


def _post(engine, path: str, body) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(engine.url + path, content=body, headers={"content-type": "application/json"},
                          timeout=60)
    return httpx.post(engine.url + path, json=body, timeout=60)


def _chat(messages: list[dict], **fields) -> dict:
    return {"messages": messages, "temperature": 0, **fields}


def test_a_null_max_completion_tokens_leaves_max_tokens_in_force(tiny_mixed_engine):
    """Typed clients send `"max_completion_tokens": null` beside the max_tokens they set."""
    body = _chat([{"role": "user", "content": "hi"}], max_tokens=3, max_completion_tokens=None,
                 ignore_eos=True)
    reply = _post(tiny_mixed_engine, CHAT, body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 3


def test_max_completion_tokens_is_honoured_and_wins_over_max_tokens(tiny_mixed_engine):
    for fields, expected in (({"max_completion_tokens": 2}, 2),
                             ({"max_completion_tokens": 2, "max_tokens": 5}, 2)):
        body = _chat([{"role": "user", "content": "hi"}], ignore_eos=True, **fields)
        reply = _post(tiny_mixed_engine, CHAT, body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == expected, fields


@pytest.mark.parametrize("raw, needle", [
    (b'{"prompt": "hi", "max_tokens": "5"}', "max_tokens must be an integer >= 1, got '5'"),
    (b'{"prompt": "hi", "max_completion_tokens": 0}', "max_completion_tokens must be an integer >= 1"),
    (b'{"prompt": "hi", "max_tokens": true}', "max_tokens must be an integer >= 1"),
])
def test_a_bad_token_limit_is_named_as_the_client_sent_it(tiny_mixed_engine, raw, needle):
    reply = _post(tiny_mixed_engine, "/v1/completions", raw)
    assert reply.status_code == 400, reply.text
    assert needle in reply.json()["error"]["message"]


@pytest.mark.parametrize("path, raw, field", [
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 1e999}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "top_k": 1e999}', "top_k"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "seed": -1e999}', "seed"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "stop_token_ids": [1e999]}', "stop_token_ids"),
    ("/generate", b'{"text": "hi", "sampling_params": {"max_new_tokens": 1e999}}', "max_new_tokens"),
    ("/generate", b'{"text": "hi", "sampling_params": {"temperature": 1' + b"0" * 400 + b'}}',
     "sampling_params"),
])
def test_numbers_too_large_for_their_field_are_a_400_not_a_500(tiny_mixed_engine, path, raw, field):
    reply = _post(tiny_mixed_engine, path, raw)
    assert reply.status_code == 400, reply.text
    assert field in reply.json()["error"]["message"]


def test_non_text_content_parts_are_refused_not_dropped(tiny_mixed_engine):
    """An image dropped silently would get an answer to another question."""
    parts = [{"type": "text", "text": "what is in this picture?"},
             {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    reply = _post(tiny_mixed_engine, CHAT, _chat([{"role": "user", "content": parts}], max_tokens=2))
    assert reply.status_code == 400, reply.text
    assert "messages[0].content[1] (type 'image_url') is not supported" in reply.json()["error"]["message"]
    reply = _post(tiny_mixed_engine, CHAT, _chat([{"role": "user", "content": [{"type": "text"}]}]))
    assert reply.status_code == 400
    assert "messages[0].content[0].text must be a string" in reply.json()["error"]["message"]


def test_text_parts_are_the_same_prompt_as_a_string(tiny_mixed_engine):
    parts = [{"type": "text", "text": "the capital "}, {"type": "text", "text": "of France"}]
    as_parts = _post(tiny_mixed_engine, CHAT, _chat([{"role": "user", "content": parts}], max_tokens=4))
    as_text = _post(tiny_mixed_engine, CHAT, _chat([{"role": "user", "content": "the capital of France"}],
                                                   max_tokens=4))
    assert as_parts.status_code == as_text.status_code == 200, as_parts.text
    # (The second finds the first's prefix cached, so only the token counts are compared.)
    assert as_parts.json()["usage"]["prompt_tokens"] == as_text.json()["usage"]["prompt_tokens"]
    assert as_parts.json()["choices"][0]["message"] == as_text.json()["choices"][0]["message"]


def test_a_developer_message_is_the_system_message(tiny_mixed_engine):
    """OpenAI's `developer` role replaces `system`; chat templates know only `system`."""
    answers = []
    for role in ("developer", "system"):
        messages = [{"role": role, "content": "answer briefly"}, {"role": "user", "content": "hi"}]
        reply = _post(tiny_mixed_engine, CHAT, _chat(messages, max_tokens=4))
        assert reply.status_code == 200, reply.text
        answers.append((reply.json()["usage"]["prompt_tokens"], reply.json()["choices"][0]["message"]))
    assert answers[0] == answers[1]


def test_sglang_sampling_extensions_are_refused_unless_neutral(tiny_mixed_engine):
    """min_p and constrained decoding change the answer: refused, not silently ignored."""
    for field, value in (("min_p", 0.1), ("regex", "[0-9]+"), ("json_schema", "{}")):
        reply = _post(tiny_mixed_engine, CHAT, _chat([{"role": "user", "content": "hi"}], **{field: value}))
        assert reply.status_code == 400, (field, reply.text)
        assert f"{field}=" in reply.json()["error"]["message"]
    neutral = _chat([{"role": "user", "content": "hi"}], max_tokens=2, min_p=0.0, regex=None)
    assert _post(tiny_mixed_engine, CHAT, neutral).status_code == 200


def test_vllm_extensions_are_refused_unless_neutral(tiny_mixed_engine):
    """vLLM's clients send these; each was answered 200 without what it asked for (a stop string
    left out though asked in, a guided choice unguided, usage on no chunk but the last)."""
    for extra, named in ((dict(include_stop_str_in_output=True), "include_stop_str_in_output="),
                         (dict(guided_choice=["yes", "no"]), "guided_choice="),
                         (dict(typical_p=0.5), "typical_p="),
                         (dict(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
                          "stream_options.continuous_usage_stats=")):
        reply = _post(tiny_mixed_engine, CHAT, _chat([{"role": "user", "content": "hi"}], **extra))
        assert reply.status_code == 400 and named in reply.json()["error"]["message"], (extra, reply.text)
    neutral = _chat([{"role": "user", "content": "hi"}], max_tokens=2, include_stop_str_in_output=False,
                    typical_p=1.0, stream_options={"continuous_usage_stats": False})
    assert _post(tiny_mixed_engine, CHAT, neutral).status_code == 200


_TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}


def test_a_tool_using_history_is_refused_as_tool_calls_not_as_bad_content(tiny_mixed_engine):
    """A tool-using client sends back its assistant turn, `content: null` plus `tool_calls`, and
    the tool's result: the engine implements no tools, and must say that, not blame `content`."""
    import openai

    history = [{"role": "user", "content": "weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [_TOOL_CALL]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    client = openai.OpenAI(base_url=f"{tiny_mixed_engine.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=history, max_tokens=2)
    message = caught.value.message
    assert ("messages[1] is a message with `tool_calls`: "
            "tool calls are not supported by this engine") in message
    assert "content must be" not in message
    reply = _post(tiny_mixed_engine, CHAT, _chat([history[0], {"role": "tool", "tool_call_id": "call_1",
                                                               "content": "sunny"}]))
    assert reply.status_code == 400, reply.text
    assert "messages[1] is a tool result (role 'tool'): tool calls are not supported" in (
        reply.json()["error"]["message"])


def test_an_assistant_message_with_null_content_is_an_empty_turn(tiny_mixed_engine):
    """OpenAI's API allows `content: null` (or none) on an assistant message without tool calls."""
    answers = []
    for assistant in ({"role": "assistant", "content": None}, {"role": "assistant"},
                      {"role": "assistant", "content": None, "tool_calls": []},
                      {"role": "assistant", "content": ""}):
        messages = [{"role": "user", "content": "hi"}, assistant, {"role": "user", "content": "and?"}]
        reply = _post(tiny_mixed_engine, CHAT, _chat(messages, max_tokens=2))
        assert reply.status_code == 200, (assistant, reply.text)
        answers.append(reply.json()["usage"]["prompt_tokens"])
    assert len(set(answers)) == 1
    # Only the assistant may say nothing: a user message still needs its content.
    reply = _post(tiny_mixed_engine, CHAT, _chat([{"role": "user", "content": None}]))
    assert reply.status_code == 400
    assert "messages[0].content must be a string or text parts" in reply.json()["error"]["message"]


@pytest.mark.parametrize("options, needle", [
    ({"include_usage": "no"}, "stream_options.include_usage must be a boolean, got 'no'"),
    ({"include_usage": 0}, "stream_options.include_usage must be a boolean, got 0"),
    ([], "stream_options must be an object, got []"),
])
def test_stream_options_of_the_wrong_type_are_a_400_not_a_guess(tiny_mixed_engine, options, needle):
    """`"include_usage": "no"` read as true (a usage chunk the client said it did not want), and
    a list where the object goes passed unnoticed."""
    body = _chat([{"role": "user", "content": "hi"}], max_tokens=2, stream=True, stream_options=options)
    reply = _post(tiny_mixed_engine, CHAT, body)
    assert reply.status_code == 400, reply.text
    assert needle in reply.json()["error"]["message"]


def test_stream_options_left_null_or_false_send_no_usage_chunk(tiny_mixed_engine):
    for options in (None, {"include_usage": None}, {"include_usage": False}):
        body = _chat([{"role": "user", "content": "hi"}], max_tokens=2, stream=True, stream_options=options)
        with httpx.stream("POST", tiny_mixed_engine.url + CHAT, json=body, timeout=60) as reply:
            assert reply.status_code == 200, reply.read()
            events = [line for line in reply.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and '"usage"' not in "".join(events), options
