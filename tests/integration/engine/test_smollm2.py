"""The real SmolLM2-135M behind a real engine server, through the official OpenAI client."""
from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(smollm2_mixed_engine):
    return openai.OpenAI(base_url=smollm2_mixed_engine.url + "/v1", api_key="unused", timeout=120)


def test_chat_answers_paris(client):
    resp = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=20, temperature=0)
    answer = resp.choices[0].message.content
    assert "Paris" in answer
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens > 0 and resp.usage.prompt_tokens > 5


def test_chat_streams_the_same_answer(client):
    stream = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
    assert "Paris" in "".join(pieces)
    assert usage is not None and usage.completion_tokens > 0


def test_stop_string_is_removed_from_the_answer(client):
    resp = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=20, temperature=0,
                                          stop=["Paris"])
    answer = resp.choices[0].message.content
    assert "Paris" not in answer and answer.strip()
    assert resp.choices[0].finish_reason == "stop"


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
