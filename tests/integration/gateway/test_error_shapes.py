"""Every error a client gets from the gateway is OpenAI-shaped, `{"error": {"message", "type",
"code"}}`, so the `openai` client shows its message: unknown paths and methods (FastAPI's
`{"detail": ...}` before), an engine's error whatever body it wrote (a plain-text 500 went out
labelled JSON). A trailing slash is served as the path without it, never redirected."""
from __future__ import annotations

import httpx
import openai
import pytest

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _error(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert error["code"] == status and isinstance(error["type"], str)
    return error


@pytest.mark.parametrize("method, path", [("GET", "/nope"), ("POST", "/v1/complete"),
                                          ("POST", "/v2/chat/completions/"), ("GET", "/")])
def test_an_unknown_path_is_an_openai_404_naming_it(pd_stack, method, path):
    gateway, _ = pd_stack()
    error = _error(httpx.request(method, gateway.url + path, json={}), 404)
    assert error["message"].startswith(f"Invalid URL ({method} {path})")
    assert "POST /v1/chat/completions" in error["message"]


def test_the_openai_client_with_a_base_url_missing_v1_says_what_is_wrong(pd_stack):
    gateway, engines = pd_stack()
    client = openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="stub-model", **CHAT)
    assert "Invalid URL (POST /chat/completions)" in caught.value.message
    assert not engines["decode"].requests


@pytest.mark.parametrize("method, path, allowed", [("GET", "/v1/completions", "POST"),
                                                   ("DELETE", "/health", "GET"),
                                                   ("POST", "/v1/models", "GET")])
def test_a_wrong_method_is_an_openai_405_naming_what_is_allowed(pd_stack, method, path, allowed):
    gateway, _ = pd_stack()
    reply = httpx.request(method, gateway.url + path)
    error = _error(reply, 405)
    assert reply.headers["allow"] == allowed
    assert error["message"] == f"method {method} is not allowed on {path} (allowed: {allowed})"


@pytest.mark.parametrize("path, body", [("/v1/completions/", {"prompt": "hi", "max_tokens": 2}),
                                        ("/v1/chat/completions/", CHAT),
                                        ("/generate/", {"text": "hi"})])
@pytest.mark.parametrize("stream", [False, True])
def test_a_trailing_slash_is_served_not_redirected(pd_stack, path, body, stream):
    gateway, engines = pd_stack()
    reply = httpx.post(gateway.url + path, json={**body, "stream": stream})
    assert reply.status_code == 200, (reply.status_code, reply.headers, reply.text)
    assert "location" not in reply.headers
    if stream:
        assert reply.text.rstrip().endswith("data: [DONE]")
    else:
        assert reply.json()
    # The engines are sent the canonical path: they would redirect the slash form themselves.
    assert [r["path"] for r in engines["decode"].requests] == [path.rstrip("/")]


def test_get_paths_with_a_trailing_slash_are_served_too(pd_stack):
    gateway, _ = pd_stack()
    for path in ("/health", "/live", "/v1/models", "/v1/models/stub-model"):
        slashed = httpx.get(gateway.url + path + "/")
        assert slashed.status_code == 200, (path, slashed.text)
        assert slashed.json() == httpx.get(gateway.url + path).json()


def test_an_engine_s_plain_text_500_reaches_the_client_openai_shaped(pd_stack):
    gateway, engines = pd_stack()
    engines["decode"].failure = (500, "text/plain; charset=utf-8", b"Internal Server Error")
    error = _error(httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT), 500)
    assert error["type"] == "server_error"
    assert error["message"].startswith("decode pod ")
    assert error["message"].endswith("answered 500: Internal Server Error")
    # Streaming asked for: the error comes before any stream began, the same way.
    error = _error(httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "stream": True}), 500)
    assert error["message"].endswith("answered 500: Internal Server Error")
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(model="stub-model", prompt="hi", max_tokens=2)
    assert caught.value.message.endswith("answered 500: Internal Server Error")


def test_an_engine_s_json_error_passes_through_as_it_was_written(pd_stack):
    gateway, engines = pd_stack()
    written = b'{"object": "error", "message": "prompt too long", "type": "BadRequestError", "code": 400}'
    engines["decode"].failure = (400, "application/json", written)
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"})
    assert (reply.status_code, reply.content) == (400, written)
    assert reply.headers["content-type"] == "application/json"


def test_an_engine_with_no_body_or_a_redirect_still_gives_a_message(pd_stack):
    gateway, engines = pd_stack()
    engines["decode"].failure = (501, "text/plain", b"")
    error = _error(httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"}), 501)
    assert error["message"].endswith("answered 501 with no body")
    # A redirect names the engine's own address: not the client's to follow.
    engines["decode"].failure = (307, "text/plain", b"")
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"})
    assert "location" not in reply.headers
    assert "answered 307, a redirect" in _error(reply, 502)["message"]


def test_a_retried_plain_text_502_names_the_engine_s_text(pd_stack):
    """502/503/504 mean "try another pod"; when none is left (one decode pod here) the gateway's
    own 503 says what the last one answered, a proxy's HTML page included."""
    gateway, engines = pd_stack()
    engines["decode"].failure = (502, "text/html", b"<html><body>502 Bad Gateway</body></html>")
    error = _error(httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"}), 503)
    assert "answered 502: <html><body>502 Bad Gateway</body></html>" in error["message"]
