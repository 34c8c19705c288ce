"""Serving over HTTP, for the gateway, the engines and the tests: listening sockets bound before
start, and uvicorn run on them (in this thread, or in a thread of its own).

Binding first (port 0 = the kernel picks a free one) means the port is known and already
accepting before anyone connects: no fixed ports, no polling for start-up races; and a port that
cannot be had is said before minutes of model loading, not after."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn

from laps_agent.serving.drain import Drain, DrainingServer
from laps_agent.serving.header_timeout import http_protocol
from laps_agent.serving.request_body import HEADER_TIMEOUT_S


class ListenError(OSError):
    """The address cannot be listened on; the message says which address and why."""


def bind_listening_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket on host:port. `host` may be a name, an IPv4 or an IPv6 address (the
    family follows it: an IPv6-only cluster listens on '::'). A port out of range, a name that
    does not resolve or a port in use raise ListenError naming the address, for the CLIs to
    print instead of a traceback."""
    where = f"{url_host(host)}:{port}"
    if not 0 <= port <= 65535:
        raise ListenError(f"cannot listen on {where}: the port must be 0-65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise ListenError(f"cannot listen on {where}: {err.strerror or err}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise ListenError(f"cannot listen on {where}: {err.strerror or err}") from None
    sock.set_inheritable(True)
    return sock


def url_host(host: str) -> str:
    """`host` as it goes in a URL: an IPv6 address in brackets."""
    return f"[{host.strip('[]')}]" if ":" in host else host


def make_server(app, header_timeout_s: float = HEADER_TIMEOUT_S, **kwargs) -> uvicorn.Server:
    """uvicorn on uvloop and httptools, its clients given `header_timeout_s` to send each
    request's headers (laps_agent/serving/header_timeout.py; <= 0: no bound)."""
    options = dict(log_level="warning", access_log=False, loop="uvloop",
                   http=http_protocol(header_timeout_s), lifespan="on", timeout_graceful_shutdown=5)
    options.update(kwargs)
    return uvicorn.Server(uvicorn.Config(app, **options))


class ServerThread:
    """`with ServerThread(app) as s: s.url` — serves until the block ends."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, **uvicorn_options) -> None:
        self._sock = bind_listening_socket(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self.url = f"http://{url_host(self.host)}:{self.port}"
        self.server = make_server(app, **uvicorn_options)
        self._thread = threading.Thread(target=self._run, name=f"uvicorn:{self.port}", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            import uvloop

            uvloop.run(self.server.serve(sockets=[self._sock]))
        except BaseException as exc:  # surfaced by start()/stop()
            self._error = exc

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        pause = threading.Event()  # never set: a poll interval, not synchronisation
        while not self.server.started and self._thread.is_alive() and time.monotonic() < deadline:
            pause.wait(0.01)
        if not self.server.started:
            self.stop()
            raise RuntimeError(f"server on {self.url} did not start: {self._error!r}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def run_forever(app, sock: socket.socket, drain: Drain | None = None, **uvicorn_options) -> int:
    """Serve on `sock` in this thread until SIGINT/SIGTERM: with a `drain`, the first signal
    drains (laps_agent/serving/drain.py) and the return follows; without, uvicorn's own handlers.
    Returns the exit status the process should have (DrainingServer.exit_status)."""
    import uvloop

    server = make_server(app, **uvicorn_options)
    if drain is not None:
        server = DrainingServer(server.config, drain)
    try:
        uvloop.run(server.serve(sockets=[sock]))
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: already shut down
        pass
    return server.exit_status if isinstance(server, DrainingServer) else 0
