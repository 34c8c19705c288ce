"""A client that keeps its connection open but stops reading a stream (a stuck consumer, an SDK
stream left open after `break`): once its socket and the gateway's buffers are full, the gateway
waited for it with no bound. The request held its decode pod's slot and its class's decode share
(so that class got 429s sooner) for as long as the client lived, past the request deadline. The
gateway now drops such a connection after --client-stall-s or at the deadline."""
from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.support.fixtures_gateway import poll

# Far more than the client's small receive buffer, the gateway's socket buffers and uvicorn's
# write buffer together hold (each event is about 150 bytes): the gateway's sends must block.
TOKENS = 200_000


def _stalled_stream(url: str) -> socket.socket:
    """A streaming request whose client reads the status line, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # before connecting: the window
    sock.connect((host, int(port)))
    body = json.dumps({"prompt": "hi", "max_tokens": TOKENS, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
    sock.settimeout(30)
    assert sock.recv(12).startswith(b"HTTP/1.1 200")
    return sock


def _decode_pending(gateway) -> int:
    return httpx.get(f"{gateway.url}/laps_status").json()["decode"]["pods"][0]["pending_requests"]


def _read_to_the_close(sock: socket.socket) -> None:
    """Read what is left until the gateway's close (the end, or a reset); a connection left
    open fails the test by the socket's timeout."""
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass


@pytest.mark.parametrize("bound", ["silence", "deadline"])
def test_a_client_that_stops_reading_is_dropped_and_its_decode_slot_freed(stub_engines, gateway_server, bound):
    from laps_agent.gateway.config import ProxyConfig
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    prefill, _ = stub_engines("prefill")
    decode, _ = stub_engines("decode", max_tokens_cap=TOKENS)
    limits = ({"proxy": ProxyConfig(client_stall_s=1.0)} if bound == "silence"
              else {"request_deadline_s": 2.0})
    gateway = gateway_server(StaticDiscovery(StaticSpec((prefill.url,), (), (decode.url,))), **limits)
    sock = _stalled_stream(gateway.url)
    try:
        poll(lambda: _decode_pending(gateway) == 1, message="the stream under way")
        # Neither bound is a test timing: the watchdog checks every half bound; the wait below
        # is only the test's own limit on a failing run.
        poll(lambda: _decode_pending(gateway) == 0, timeout=30, message="the stalled stream's decode slot freed")
        _read_to_the_close(sock)
        assert 'laps_gateway_errors_total{reason="client_stalled"} 1.0' in httpx.get(f"{gateway.url}/metrics").text
    finally:
        sock.close()
    # The gateway serves on: a client that reads gets its whole answer.
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
