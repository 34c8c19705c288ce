"""The same burst against a prefill server with the plugin installed but off: SGLang's own
scheduling, unchanged — the long request that arrived first runs no later than the short ones
(first come, first served), and no laps_engine_* series appear."""
from __future__ import annotations

import httpx
import pytest

from tests.sglang.burst import L1_WORDS, Sender, prompt, send_short_first_burst, sglang_batches
from tests.sglang.conftest import start_prefill
from tests.support.waiting import poll

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def vanilla_prefill(sglang_logs, retire):
    server = start_prefill(sglang_logs, {})  # the plugin is installed, LAPS_SCHEDULER unset
    try:
        yield server.wait_ready()
    finally:
        retire(server)


def test_plugin_off_is_first_come_first_served(vanilla_prefill, decode_server, gateway_for):
    gateway = gateway_for(vanilla_prefill, decode_server)
    warm = Sender(gateway)  # the first request of a fresh server pays one-off costs
    warm.send("warm-up", prompt(8, seed=0))
    warm.join()
    a = Sender(gateway)
    a.send("L1", prompt(L1_WORDS, seed=1))
    # Sync point: SGLang logs the long request's prefill batch (the only one over 256 tokens).
    first = poll(lambda: next((i for i, (_, t) in enumerate(sglang_batches(vanilla_prefill.log_text()))
                               if t > 256), None) is not None and len(sglang_batches(vanilla_prefill.log_text())),
                 timeout=120, message="the long request's batch to start")
    send_short_first_burst(a)
    done = a.join()
    tokens = {name: t for name, (_, t) in done.items()}
    later = sglang_batches(vanilla_prefill.log_text())[first:]
    # L2 went with the first batch after L1: no batch of short requests overtook it.
    assert later and later[0][1] >= tokens["L2"] - 1, (later, tokens)  # -1: a cached first token
    # Installed (the set-up script checks the entry point) but off: no hook, no LAPS series.
    assert "LAPS scheduler active" not in vanilla_prefill.log_text()
    assert "laps_engine_" not in httpx.get(f"{vanilla_prefill.url}/metrics", timeout=10).text
