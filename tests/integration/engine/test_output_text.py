"""The answer's text as clients read it, on the three endpoints, streamed and not: the same text,
finish reason and token counts either way, and the text a decode of the output ids reads."""
from __future__ import annotations

import httpx

from tests.integration.engine.helpers import sse_events

# The tiny model (seed 0) answers this greedily with " capital" 16 times, then with a byte that
# starts a character no later token completes: the case where text and tokens parted ways.
PROMPT, TOKENS = "The capital", 24


def _post(engine, path: str, body: dict) -> httpx.Response:
    resp = httpx.post(engine.url + path, json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp


def test_bytes_that_never_form_a_character_are_in_the_text_streamed_or_not(tiny_mixed_engine, tiny_engine_model):
    """The engine held back output bytes waiting for the rest of their character and dropped
    them when the answer ended: `text` lacked what `output_ids` and `completion_tokens` held
    (4095 tokens of output read as 128 characters), where SGLang returns them as U+FFFD."""
    from laps_agent.modelio.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_engine_model)
    sp = {"max_new_tokens": TOKENS, "temperature": 0}
    whole = _post(tiny_mixed_engine, "/generate", {"text": PROMPT, "sampling_params": sp}).json()
    decoded = tok.decode(whole["output_ids"])
    assert decoded.endswith("\ufffd"), decoded  # the case under test
    assert whole["text"] == decoded and whole["meta_info"]["completion_tokens"] == TOKENS
    events = sse_events(_post(tiny_mixed_engine, "/generate",
                              {"text": PROMPT, "sampling_params": sp, "stream": True}).text)
    assert events[-1] == "[DONE]" and events[-2]["text"] == decoded

    openai = {"max_tokens": TOKENS, "temperature": 0}
    for path, body, read in (
            ("/v1/completions", {"prompt": PROMPT}, lambda c: c.get("text")),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]},
             lambda c: (c.get("message") or c.get("delta") or {}).get("content"))):
        answer = _post(tiny_mixed_engine, path, {**body, **openai}).json()
        text, usage = read(answer["choices"][0]), answer["usage"]
        if path == "/v1/completions":
            assert text == decoded
        stream = sse_events(_post(tiny_mixed_engine, path, {**body, **openai, "stream": True,
                                                            "stream_options": {"include_usage": True}}).text)
        chunks = [e for e in stream[:-1] if e["choices"]]
        assert "".join(read(c["choices"][0]) or "" for c in chunks) == text, path
        assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == answer["choices"][0]["finish_reason"] == "length"
        streamed_usage = stream[-2]["usage"]
        assert (streamed_usage["prompt_tokens"], streamed_usage["completion_tokens"]) == \
            (usage["prompt_tokens"], usage["completion_tokens"]) == (usage["prompt_tokens"], TOKENS), path


def test_a_stream_reads_as_openai_and_sglang_shape_it(tiny_mixed_engine):
    """Every event of a stream carries its first's `created` (ours took the clock per event, so
    one answer spanned several seconds' values); with include_usage each content chunk says
    `"usage": null`, as OpenAI documents, until the usage chunk; /generate says a length stop
    as SGLang does, `{"type": "length", "length": n}` (a client reading `.length` got nothing)."""
    for path, body in (("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]})):
        stream = sse_events(_post(tiny_mixed_engine, path, {
            **body, "max_tokens": TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}).text)
        events = stream[:-1]
        assert len({e["created"] for e in events}) == 1, path
        chunks, (usage,) = events[:-1], events[-1:]
        assert chunks and all(c["usage"] is None and c["choices"] for c in chunks), path
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == TOKENS, path
    plain = sse_events(_post(tiny_mixed_engine, "/v1/completions", {
        "prompt": PROMPT, "max_tokens": 2, "stream": True}).text)
    assert all("usage" not in e for e in plain[:-1])   # not asked for: not there
    meta = _post(tiny_mixed_engine, "/generate", {"text": PROMPT, "sampling_params": {
        "max_new_tokens": 3, "temperature": 0}}).json()["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 3}
