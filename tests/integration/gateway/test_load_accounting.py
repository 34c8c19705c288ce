"""Pending work per group as /laps_status and /metrics show it: counted from dispatch until the
prefill phase ends (the prefill engine's answer), while the decode side stays busy."""
from __future__ import annotations

import threading

import httpx

from tests.support.fixtures_gateway import RawRequest, poll


def _status(gateway) -> dict:
    return httpx.get(f"{gateway.url}/laps_status").json()


def test_pending_tokens_end_with_the_prefill_phase(stub_engines, gateway_server):
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec

    prefill_done = threading.Event()
    prefill, prefill_engine = stub_engines("prefill", prefill_gate=prefill_done)
    decode, decode_engine = stub_engines("decode", first_token_delay_s=60)
    gateway = gateway_server(StaticDiscovery(StaticSpec((prefill.url,), (), (decode.url,))))
    request = RawRequest(gateway.url, "/v1/completions", {"prompt": "count these words"})
    try:
        poll(lambda: prefill_engine.requests, message="the prefill engine to get the request")
        during = _status(gateway)["groups"]["short"]
        assert during["pending_requests"] == 1 and during["pending_tokens"] > 0
        assert during["pods"][0]["pending_tokens"] == during["pending_tokens"]
        metrics = httpx.get(f"{gateway.url}/metrics").text
        assert 'laps_gateway_pending_requests{group="short"} 1.0' in metrics
        prefill_done.set()
        after = poll(lambda: (s := _status(gateway))["groups"]["short"]["pending_tokens"] == 0 and s,
                     message="the prefill phase to end")
        assert after["groups"]["short"]["pending_requests"] == 0
        assert after["decode"]["pods"][0]["pending_requests"] == 1  # still generating
        assert not decode_engine.disconnects
    finally:
        prefill_done.set()
        request.hang_up()
    poll(lambda: decode_engine.disconnects == 1, message="the decode call to be cancelled")
    poll(lambda: _status(gateway)["decode"]["pods"][0]["pending_requests"] == 0,
         message="decode pending to drain")
