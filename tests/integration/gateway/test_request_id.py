"""X-Request-ID through the gateway (laps_agent/serving/request_id.py): every answer carries one, which
the official `openai` client exposes as `_request_id` (and `request_id` on its errors); a sane
one the caller sent comes back unchanged, anything else is replaced; both engines get the same
id, and the gateway's log lines about a failed attempt name it."""
from __future__ import annotations

import logging
import re

import httpx
import openai
import pytest

CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MADE = re.compile(r"[0-9a-f]{32}")   # an id the gateway made


@pytest.fixture
def stack(pd_stack):
    gateway, engines = pd_stack()
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    yield gateway, engines, client
    client.close()


def _seen_by(engines: dict) -> set[str]:
    """The ids the engines that served the request received (one prefill, the decode)."""
    return {engine.requests[-1]["request_id"] for engine in engines.values() if engine.requests}


def test_the_openai_client_gets_an_id_and_both_engines_got_it(stack):
    _, engines, client = stack
    answer = client.chat.completions.create(**CHAT)
    assert answer.choices[0].message.content
    assert MADE.fullmatch(answer._request_id)
    assert _seen_by(engines) == {answer._request_id}
    assert len([e for e in engines.values() if e.requests]) == 2   # a prefill pod and the decode pod
    again = client.chat.completions.create(**CHAT)
    assert again._request_id != answer._request_id


def test_a_stream_carries_the_id_too(stack):
    _, engines, client = stack
    stream = client.chat.completions.create(**CHAT, stream=True)
    rid = stream.response.headers["x-request-id"]
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert MADE.fullmatch(rid) and _seen_by(engines) == {rid}


def test_the_callers_id_comes_back_unchanged_and_reaches_the_engines(stack):
    _, engines, client = stack
    rid = "trace-2024/Ab_9:x=y"
    answer = client.chat.completions.create(**CHAT, extra_headers={"X-Request-ID": rid})
    assert answer._request_id == rid
    assert _seen_by(engines) == {rid}
    stream = client.chat.completions.create(**CHAT, stream=True, extra_headers={"X-Request-ID": rid})
    assert stream.response.headers["x-request-id"] == rid
    stream.close()


@pytest.mark.parametrize("bad", [b"x" * 129, b"a\tb", b"two words", "caf\u00e9".encode()],
                         ids=["too-long", "control-char", "space", "not-ascii"])
def test_an_id_unfit_for_a_log_line_is_replaced(stack, bad):
    gateway, engines, _ = stack
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, headers={"x-request-id": bad})
    assert reply.status_code == 200, reply.text
    rid = reply.headers["x-request-id"]
    assert MADE.fullmatch(rid) and _seen_by(engines) == {rid}


def test_the_gateways_own_errors_carry_the_id(stack):
    gateway, _, client = stack
    # 400: a body that is no JSON (the work route's own refusal), with the caller's id
    bad = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{nope",
                     headers={"x-request-id": "client-7"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "client-7"
    # 404: no such path (FastAPI's routing, past the fast path), with an id made here
    nowhere = httpx.get(f"{gateway.url}/v1/nothing-here")
    assert nowhere.status_code == 404 and MADE.fullmatch(nowhere.headers["x-request-id"])
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(**{**CHAT, "model": "other"}, extra_headers={"X-Request-ID": "c-8"})
    assert unknown.value.request_id == "c-8"


def test_the_key_guards_refusals_carry_the_id(pd_stack, tmp_path):
    keys = tmp_path / "api-keys"
    keys.write_text("sk-good-0123456789\n")
    # 0.01/s: the key's bucket holds one request and refills in 100 s (no race)
    gateway, _ = pd_stack(api_keys_file=str(keys), rate_limit_per_key=0.01)
    missing = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT)
    assert missing.status_code == 401 and MADE.fullmatch(missing.headers["x-request-id"])
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-good-0123456789", max_retries=0)
    assert client.chat.completions.create(**CHAT)._request_id   # the bucket's one request
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(**CHAT, extra_headers={"X-Request-ID": "c-9"})
    assert limited.value.request_id == "c-9"
    client.close()


def test_a_failed_attempt_is_logged_with_the_id(stack, caplog):
    _, engines, client = stack
    caplog.set_level(logging.INFO, logger="laps_agent")
    engines["decode"].failure = (502, "text/html", b"<html>bad gateway</html>")
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(**CHAT, extra_headers={"X-Request-ID": "incident-42"})
    assert caught.value.status_code == 503 and caught.value.request_id == "incident-42"
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("incident-42" in line and "attempt 1 failed" in line and "decode pod" in line
               for line in lines), lines
    assert any("incident-42" in line and "failed with 503" in line for line in lines), lines
