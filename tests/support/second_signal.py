"""A drain cut short by a second signal, as a user stops a process with Ctrl-C twice: what the
engine and gateway tests run against a real `laps engine` / `laps gateway` process."""
from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from tests.support.waiting import poll


@dataclass
class SecondSignal:
    exit_status: int
    exit_s: float                 # from the second signal to the exit
    stream: tuple[int, list, str]  # (status, SSE events, what broke the transfer or "")
    plain: httpx.Response         # the non-streamed request's answer


def _stream(url: str, body: dict, began: threading.Event) -> tuple[int, list, str]:
    status, events = 0, []
    try:
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as reply:
            status = reply.status_code
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                    began.set()
    except httpx.HTTPError as exc:  # e.g. the chunked body ended without its last chunk
        return status, events, repr(exc)
    return status, events, ""


def stop_twice(process: subprocess.Popen, base_url: str, body: dict, holds_both, *,
               second: int = signal.SIGINT) -> SecondSignal:
    """Send `base_url`/v1/completions a stream and a plain request (`body`, long enough to be held
    all along); once the stream began and `holds_both()`, SIGTERM (a drain), wait until it is
    unready, then `second`."""
    began = threading.Event()
    url = base_url + "/v1/completions"
    with ThreadPoolExecutor(2) as pool:
        streamed = pool.submit(_stream, url, body, began)
        plain = pool.submit(httpx.post, url, json=body, timeout=60)
        poll(lambda: began.is_set() and holds_both(), timeout=30, message="both requests held")
        process.send_signal(signal.SIGTERM)
        poll(lambda: httpx.get(base_url + "/health").status_code == 503, timeout=5,
             message="the drain to begin")
        process.send_signal(second)
        signalled = time.monotonic()
        code = process.wait(15)
        exit_s = time.monotonic() - signalled
        return SecondSignal(code, exit_s, streamed.result(), plain.result())
