"""Fixtures for gateway tests: stub PD engines (in-thread or as processes) and gateways on
loopback. Every server or process started here is stopped at teardown, also on failure."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.waiting import poll  # noqa: F401  (re-exported: tests import it from here)

REPO = Path(__file__).resolve().parents[2]


class RawRequest:
    """An HTTP request sent over a plain socket that the test closes when it chooses: the way
    to hang up at a known point (no client-side timeout racing the server)."""

    def __init__(self, url: str, path: str, body: dict, sent: int | None = None) -> None:
        """`sent`: send only the body's first `sent` bytes (a client that hangs up mid-upload)."""
        import json
        import socket
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        payload = json.dumps(body).encode()
        self.sock = socket.create_connection((parts.hostname, parts.port))
        self.sock.sendall(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (path.encode(), len(payload),
                                                              payload[:sent]))

    def answer_to_eof(self, timeout: float = 30.0) -> tuple[bytes, bytes]:
        """(head, body) of the server's answer, read until it closes the connection; `timeout`
        bounds each read of a failing test."""
        self.sock.settimeout(timeout)
        answer = b""
        while chunk := self.sock.recv(65536):
            answer += chunk
        self.hang_up()
        head, _, body = answer.partition(b"\r\n\r\n")
        return head, body

    def hang_up(self) -> None:
        self.sock.close()


def stalled_body_message(head: bytes, body: bytes) -> str:
    """The message of a 408 for a body that stopped arriving, after checking it is one that
    closed the connection (what the gateway and the engines answer alike)."""
    import json

    assert head.startswith(b"HTTP/1.1 408 "), head + body
    assert b"connection: close" in head.lower()
    return json.loads(body)["error"]["message"]


@pytest.fixture
def stub_engines():
    """start(role, **StubEngine options) -> (ServerThread, StubEngine) serving in a thread."""
    from laps_agent.serving.listen import ServerThread
    from tests.support.stub_engine import StubEngine

    started: list[ServerThread] = []

    def start(role: str, **options):
        engine = StubEngine(role, **options)
        server = ServerThread(engine).start()
        started.append(server)
        return server, engine

    yield start
    for server in started:
        server.stop()


class ChildProcess:
    def __init__(self, argv: list[str], env: dict | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, start_new_session=True)

    def read_line_starting(self, prefix: str, timeout: float = 30.0) -> str:
        seen = []
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:  # blocks per line; the process prints promptly
            seen.append(line)
            if line.startswith(prefix):
                return line.strip()
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"no line starting {prefix!r}; output so far:\n{''.join(seen)}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def stub_processes():
    """start(role, *extra_args) -> (ChildProcess, url) for a stub engine in its own process."""
    children: list[ChildProcess] = []

    def start(role: str, *extra: str):
        child = ChildProcess([sys.executable, "-m", "tests.support.stub_engine",
                              "--role", role, "--port", "0", *extra],
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        children.append(child)
        port = int(child.read_line_starting("LISTENING").split()[1])
        return child, f"http://127.0.0.1:{port}"

    yield start
    for child in children:
        child.kill()
        child.proc.stdout.close()


@pytest.fixture
def gateway_server():
    """start(discovery, **GatewayConfig fields) -> ServerThread serving a gateway app; waits
    until the discovery shows at least one prefill and one decode pod unless told not to.
    `server_options`: make_server's (laps_agent/serving/listen.py), e.g. header_timeout_s."""
    from laps_agent.gateway.config import GatewayConfig
    from laps_agent.gateway.estimate import TokenEstimator
    from laps_agent.gateway.http.app import create_app
    from laps_agent.serving.listen import ServerThread

    started: list[ServerThread] = []

    def start(discovery, *, wait_ready: bool = True, estimator=None, server_options=None, **config):
        app = create_app(GatewayConfig(**config), discovery, estimator or TokenEstimator(None))
        server = ServerThread(app, **(server_options or {})).start()
        started.append(server)
        server.gateway = app.state.gateway
        if wait_ready:
            def ready():
                m = discovery.membership()
                return m.decode and any(m.groups.values())
            poll(ready, message="gateway discovery to see its pods")
        return server

    yield start
    for server in started:
        server.stop()
