"""Slow clients against the gateway's server (laps_agent/serving/listen.py make_server, which `laps
gateway` and `laps local` serve with): a connection that never sends a byte, or stops halfway
through its headers (slowloris), was held forever, one file descriptor each, until enough of them
took the gateway down for everyone. Now each gets `header_timeout_s` (60 s; 0.5 s here), while a
request being answered, a stream included, is never cut by it."""
from __future__ import annotations

import http.client
import io
import json
import socket
import time

import httpx
import pytest

TIMEOUT_S = 0.5
TOKENS, TOKEN_DELAY_S = 12, 0.1   # a stream of ~1.2 s: longer than the header timeout


def _gateway(stub_engines, gateway_server, **server_options):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
    from tests.support.stub_engine import KVHandoff

    handoff = KVHandoff()
    prefill, _ = stub_engines("prefill", handoff=handoff)
    decode, _ = stub_engines("decode", handoff=handoff, token_delay_s=TOKEN_DELAY_S)
    spec = StaticSpec((prefill.url,), (prefill.url,), (decode.url,))
    return gateway_server(StaticDiscovery(spec, poll_s=0.05), served_model_name="stub-model",
                          server_options={"header_timeout_s": TIMEOUT_S, **server_options})


@pytest.fixture
def gateway(stub_engines, gateway_server):
    return _gateway(stub_engines, gateway_server)


@pytest.fixture
def short_keepalive_gateway(stub_engines, gateway_server):
    """uvicorn's keep-alive timer (5 s in production) shorter than the header timeout (60 s), as
    in production: bytes that cancel it must not leave a connection with no timer at all."""
    return _gateway(stub_engines, gateway_server, timeout_keep_alive=TIMEOUT_S / 5)


def _connect(gateway) -> socket.socket:
    sock = socket.create_connection((gateway.host, gateway.port))
    sock.settimeout(30)   # only a failing test waits this long: the server closes well before
    return sock


def _read_to_eof(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    return answer


class _Recorded(io.BytesIO):
    """Bytes read off a socket, for http.client to read answers from one after another (it
    closes its file after each answer)."""

    def makefile(self, mode: str) -> _Recorded:
        return self

    def close(self) -> None:
        pass


def _answers(data: bytes) -> list[http.client.HTTPResponse]:
    """Every HTTP answer in `data` in turn, each one's body read (`.body`)."""
    recorded, answers = _Recorded(data), []
    while recorded.tell() < len(data):
        answer = http.client.HTTPResponse(recorded)
        answer.begin()
        answer.body = answer.read()
        answers.append(answer)
    return answers


def _assert_header_timeout(answer: http.client.HTTPResponse) -> None:
    assert answer.status == 408 and answer.getheader("connection") == "close"
    assert json.loads(answer.body) == {"error": {
        "message": f"the request's headers did not arrive within {TIMEOUT_S:g}s",
        "type": "invalid_request_error", "code": 408}}


def test_a_connection_that_sends_nothing_is_closed_and_others_are_served_meanwhile(gateway):
    silent = _connect(gateway)
    ok = httpx.get(f"{gateway.url}/v1/models", timeout=30)
    assert ok.status_code == 200, ok.text
    assert _read_to_eof(silent) == b""   # closed with no answer: it asked nothing


def test_headers_that_stop_arriving_are_answered_408_and_closed(gateway):
    stalled = _connect(gateway)
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: applic")
    [answer] = _answers(_read_to_eof(stalled))
    _assert_header_timeout(answer)


def test_a_stream_outlasting_the_header_timeout_is_whole_and_its_connection_serves_on(gateway):
    """The header timer must be gone once a request's headers are in: an answer, a stream
    included, takes as long as it takes, and the keep-alive connection carries the next one."""
    conn = http.client.HTTPConnection(gateway.host, gateway.port, timeout=30)
    started = time.monotonic()
    conn.request("POST", "/v1/completions", headers={"content-type": "application/json"},
                 body=json.dumps({"prompt": "hi", "max_tokens": TOKENS, "stream": True}))
    reply = conn.getresponse()
    events = reply.read().decode()
    assert time.monotonic() - started > TIMEOUT_S   # else this test proves nothing
    assert reply.status == 200 and events.count("data: {") == TOKENS
    assert events.endswith("data: [DONE]\n\n")
    sock = conn.sock
    conn.request("GET", "/v1/models")
    second = conn.getresponse()
    assert second.status == 200 and json.loads(second.read())["data"][0]["id"] == "stub-model"
    assert conn.sock is sock   # the same connection, kept alive
    conn.close()


def test_a_stalled_pipelined_request_waits_for_the_stream_ahead_then_gets_408(short_keepalive_gateway):
    """A client pipelining a half-sent request behind a stream: cutting the connection when the
    second one's headers are late would cut the first one's stream. The stream ends whole, then
    the late request is answered 408 (uvicorn's keep-alive timer alone closed it unanswered)."""
    body = json.dumps({"prompt": "hi", "max_tokens": TOKENS, "stream": True}).encode()
    sock = _connect(short_keepalive_gateway)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(body), body)
                 + b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")   # ... and no more
    stream, late = _answers(_read_to_eof(sock))
    assert stream.status == 200 and stream.body.count(b"data: {") == TOKENS, stream.body
    assert stream.body.endswith(b"data: [DONE]\n\n")
    _assert_header_timeout(late)


def test_bytes_that_begin_no_request_after_an_answer_do_not_hold_the_connection(short_keepalive_gateway):
    """A bare CRLF after an answer begins no request, yet cancelled uvicorn's keep-alive timer:
    the connection, with no timer left, was held forever."""
    sock = _connect(short_keepalive_gateway)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    assert answer.status == 200 and json.loads(answer.read())["data"][0]["id"] == "stub-model"
    sock.sendall(b"\r\n")
    assert _read_to_eof(sock) == b""   # closed, unanswered: it asked nothing
