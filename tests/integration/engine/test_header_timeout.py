"""The engine's own servers (laps_agent/engine/http/serve.py, what `laps engine` serves with, on
either backend) bound how long a client may take over its headers, as the gateway's do
(tests/integration/gateway/test_header_timeout.py): a connection that sent nothing, or half its
headers, held a file descriptor of the engine forever, on its API port and on a prefill
engine's bootstrap (KV hand-off) port alike."""
from __future__ import annotations

import asyncio
import json
import socket
import threading

import httpx

from tests.support.waiting import poll

TIMEOUT_S = 0.5


def _read_to_eof(sock: socket.socket) -> bytes:
    sock.settimeout(30)   # only a failing test waits this long: the engine closes well before
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    return answer


def test_the_api_and_bootstrap_ports_close_connections_whose_headers_do_not_come(tiny_engine_model):
    import uvloop

    from laps_agent.emulated.build import build_emulated as build
    from laps_agent.engine.flags import build_parser
    from laps_agent.engine.http.serve import uvicorn_servers
    from laps_agent.serving.listen import bind_listening_socket

    server, engine = build(build_parser().parse_args(
        ["--backend", "emulated", "--role", "prefill", "--model", str(tiny_engine_model),
         "--labels-file", "/nonexistent"]))
    api, boot = uvicorn_servers(server, bootstrap=True, header_timeout_s=TIMEOUT_S)
    api_sock, boot_sock = bind_listening_socket(), bind_listening_socket()

    async def serve_both() -> None:
        await asyncio.gather(api.serve(sockets=[api_sock]), boot.serve(sockets=[boot_sock]))

    engine.start()
    thread = threading.Thread(target=uvloop.run, args=(serve_both(),), daemon=True)
    thread.start()
    try:
        poll(lambda: api.started and boot.started, message="the engine's servers to start")
        silent = socket.create_connection(api_sock.getsockname()[:2])
        stalled = socket.create_connection(boot_sock.getsockname()[:2])
        stalled.sendall(b"GET /kv/1 HTTP/1.1\r\nhost: x\r\n")   # ... and no more
        host, port = api_sock.getsockname()[:2]
        health = httpx.get(f"http://{host}:{port}/health", timeout=30)
        assert health.status_code == 200, health.text   # served meanwhile
        assert _read_to_eof(silent) == b""   # asked nothing, answered nothing: closed
        head, _, body = _read_to_eof(stalled).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head, head
        assert json.loads(body)["error"]["message"] == \
            f"the request's headers did not arrive within {TIMEOUT_S:g}s"
    finally:
        api.should_exit = boot.should_exit = True
        thread.join(30)
        engine.stop()
        api_sock.close()
        boot_sock.close()
