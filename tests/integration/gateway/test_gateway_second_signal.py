"""A second signal during the drain of `laps gateway` (Ctrl-C twice): it exits at once, with the
shell's status for an interrupt, without a traceback, and the clients it held hear why: a
request not answered yet gets an OpenAI-shaped 503 (not uvicorn's plain-text 500), a stream
already under way ends with an error event and a clean end of its transfer."""
from __future__ import annotations

import signal
import sys

import httpx
import pytest

from tests.support.emulated_profiles import synthetic_profile
from tests.support.fixtures_gateway import ChildProcess
from tests.support.second_signal import stop_twice
from tests.support.waiting import poll

# ~0.1 s a token: a 400-token answer is held for far longer than the test takes
PROFILE = synthetic_profile("gateway-stop", decode={"overhead_s": 0.1})


@pytest.fixture
def gateway(engine_launcher, tiny_engine_model):
    engines = engine_launcher.emulated_pd(tiny_engine_model, PROFILE)
    prefill, decode = engines.prefill, engines.decode
    child = ChildProcess([sys.executable, "-m", "laps_agent.cli", "gateway", "--host", "127.0.0.1",
                          "--port", "0", "--prefill-short", prefill.url, "--decode", decode.url,
                          "--served-model-name", "test-model", "--drain-grace-s", "30",
                          "--log-level", "warning"])
    child.url = child.read_line_starting("laps gateway listening on").split()[-1]
    child.decode = decode
    poll(lambda: httpx.get(child.url + "/health").status_code == 200, timeout=30,
         message="the gateway to see its engines")
    yield child
    child.kill()
    child.proc.stdout.close()


def test_a_second_signal_stops_the_gateway_at_once_and_tells_its_clients(gateway):
    body = {"model": "test-model", "prompt": "held", "max_tokens": 400}
    ended = stop_twice(gateway.proc, gateway.url, body,
                       lambda: gateway.decode.get_json("/get_server_info")["state"]["live"] == 2)
    output = gateway.proc.stdout.read()   # its stderr too
    # At once: what it held had ~40 s to go, its grace period 30 s (the bound allows for a busy
    # machine's slow exit).
    assert ended.exit_status == 128 + signal.SIGINT and ended.exit_s < 10, ended
    plain = ended.plain
    assert plain.status_code == 503 and plain.headers["content-type"] == "application/json", plain.text
    error = plain.json()["error"]
    assert error["type"] == "draining" and "stopped before it finished" in error["message"]
    assert plain.headers["retry-after"] == "1"
    status, events, broken = ended.stream
    assert status == 200 and not broken and events[0]["choices"][0]["text"]
    assert events[-1]["error"]["type"] == "draining" and "[DONE]" not in events, events[-3:]
    assert "Traceback" not in output and "stopping now, cutting 2 request(s) short" in output, output
