"""`laps engine`'s serving half, for both backends: the flags every engine checks before it
loads anything, the HTTP server's settings, the listening sockets (bound before the load, so a
port that cannot be had is said at once) and the uvicorn servers on them: the API and, for the
prefill role, the bootstrap (KV hand-off) port; and `run_engine`, what `laps engine` does with
them once its flags are parsed, for whichever backend builds the engine (engine/cli.py the
builtin one, emulated/cli.py the emulated one)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from typing import Any, Callable, Coroutine

from laps_agent.engine.core.config import check_mem_fraction
from laps_agent.engine.http.server import EngineServer, ServedEngine, ServerSettings, queue_bound
from laps_agent.engine.pd.wire import bootstrap_app
from laps_agent.serving.drain import DrainingServer
from laps_agent.serving.exit_reason import record_cannot_start
from laps_agent.serving.header_timeout import http_protocol
from laps_agent.serving.listen import bind_listening_socket, url_host
from laps_agent.serving.request_body import HEADER_TIMEOUT_S

log = logging.getLogger("laps.engine")


def check_server_flags(args: argparse.Namespace) -> None:
    """Flags both backends read, checked before anything loads. Unset (None) means the default;
    a value the engine cannot run with is refused naming the flag (0 running requests would
    never serve one, a negative queue bound was read as 'no bound')."""
    rules = (("bootstrap-timeout", args.bootstrap_timeout, "> 0", lambda v: v > 0),
             ("drain-grace-s", args.drain_grace_s, ">= 0", lambda v: v >= 0),
             ("max-running-requests", args.max_running_requests, ">= 1", lambda v: v >= 1),
             ("max-prefill-tokens", args.max_prefill_tokens, ">= 1", lambda v: v >= 1),
             ("max-queued-requests", args.max_queued_requests, ">= 0 (0: no bound)", lambda v: v >= 0),
             ("context-length", args.context_length, ">= 1", lambda v: v >= 1),
             ("kv-pages", args.kv_pages, ">= 1", lambda v: v >= 1),
             ("page-size", args.page_size, ">= 1", lambda v: v >= 1),
             ("torch-threads", args.torch_threads, ">= 1", lambda v: v >= 1),
             ("decode-graph-max-context", args.decode_graph_max_context, ">= 1", lambda v: v >= 1))
    for flag, value, rule, ok in rules:
        if value is not None and not ok(value):
            raise ValueError(f"--{flag} must be {rule}, got {value}")
    check_mem_fraction(args.mem_fraction)


def server_settings(args: argparse.Namespace, name: str, max_running: int, **extra):
    """The HTTP server's settings from the flags (both backends)."""
    check_server_flags(args)
    return ServerSettings(role=args.role, served_model_name=name, length_threshold=args.length_threshold,
                          bootstrap_port=args.bootstrap_port, bootstrap_timeout_s=args.bootstrap_timeout,
                          labels_file=args.labels_file, drain_grace_s=args.drain_grace_s,
                          max_queued_requests=queue_bound(args.max_queued_requests, max_running),
                          prefix_warm=args.prefix_warm, **extra)


def listen(args: argparse.Namespace):
    """The HTTP socket and, for the prefill role, the bootstrap socket, bound before the model
    loads: a port in use or out of range is said at once (ListenError), not after the load."""
    http = bind_listening_socket(args.host, args.port)
    try:
        boot = bind_listening_socket(args.host, args.bootstrap_port) if args.role == "prefill" else None
    except Exception:
        http.close()
        raise
    return http, boot


def uvicorn_servers(server, bootstrap: bool, header_timeout_s: float | None = None):
    """(API server, bootstrap server or None): the uvicorn servers of `server` (an EngineServer),
    the bootstrap one if `bootstrap` (the prefill role). Both give a client `header_timeout_s`
    (default HEADER_TIMEOUT_S) to send a request's headers (laps_agent/serving/header_timeout.py)."""
    import uvicorn

    protocol = http_protocol(HEADER_TIMEOUT_S if header_timeout_s is None else header_timeout_s)
    # SIGTERM drains (laps_agent/serving/drain.py); the bootstrap server stops only after the drain, so
    # the decode engines still collect the KV of every prefill this engine finished.
    http = DrainingServer(uvicorn.Config(server.app, log_level="warning", http=protocol), server.drain)
    boot = None
    if bootstrap:
        boot = _QuietServer(uvicorn.Config(bootstrap_app(server.outbox, server.warm_handler()),
                                           log_level="warning", timeout_graceful_shutdown=1,
                                           http=protocol))
    return http, boot


async def serve(server, http_sock, boot_sock=None) -> int:
    """Serve until stopped; returns the exit status (laps_agent/serving/drain.py: 0 once drained)."""
    http, boot = uvicorn_servers(server, bootstrap=boot_sock is not None)
    tasks = [asyncio.create_task(http.serve(sockets=[http_sock]))]
    if boot is not None:
        tasks.append(asyncio.create_task(boot.serve(sockets=[boot_sock])))

    def where(sock) -> str:
        host, port = sock.getsockname()[:2]
        return f"{url_host(host)}:{port}"
    log.info("serving http on %s%s", where(http_sock),
             f", bootstrap on {where(boot_sock)}" if boot_sock is not None else "")
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        http.should_exit = True
        if boot is not None:
            boot.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
    return http.exit_status


class _QuietServer:
    """A uvicorn server that leaves signal handling to the main HTTP server."""

    def __new__(cls, config):
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        return Server(config)


def run_engine(args: argparse.Namespace,
               build: Callable[[argparse.Namespace], tuple[EngineServer, ServedEngine]],
               run: Callable[[Coroutine[Any, Any, int]], int] = asyncio.run) -> int:
    """`laps engine` after its flags are parsed: check them, bind the ports, `build` the engine
    and its server, serve on `run`'s event loop until stopped; the exit status. A flag the
    engine cannot run with, a port that cannot be had or model files it cannot read: exit 2,
    said on stderr and left as the container's exit reason."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per KV fetch otherwise
    try:
        check_server_flags(args)
        sockets = listen(args)
    except (ValueError, OSError) as exc:  # bad flags, a port that cannot be had
        _cannot_start(exc)
        return 2
    try:
        server, engine = build(args)
    except (ValueError, OSError) as exc:  # bad flags, missing/unsupported model files
        for sock in sockets:
            if sock is not None:
                sock.close()
        _cannot_start(exc)
        return 2
    engine.start()
    try:
        return run(serve(server, *sockets))
    finally:
        engine.stop()
        log.info("engine stopped")


def _cannot_start(exc: Exception) -> None:
    log.error("cannot start: %s", exc)
    print(f"laps engine: error: {exc}", file=sys.stderr)
    record_cannot_start(str(exc))
