"""A loopback HTTP server answering every GET with what the test's `answer()` gives: the test's
stand-ins for a gateway pod's /metrics and for Prometheus' query API."""
from __future__ import annotations

import http.server
import threading
from collections.abc import Callable


class GetServer:
    """`answer()` -> (content type, body), called per GET on the server's own thread (it may
    block, as a slow upstream would)."""

    def __init__(self, answer: Callable[[], tuple[str, bytes]]) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                content_type, body = answer()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
