"""What the engines receive through the gateway: the client's body as sent, plus the gateway's
own PD fields (a client's `bootstrap_*` fields never reach an engine)."""
from __future__ import annotations

import httpx

PD_KEYS = ["bootstrap_host", "bootstrap_port", "bootstrap_room"]


def test_the_clients_fields_reach_both_engines_in_order_plus_the_pd_fields(pd_stack):
    gateway, engines = pd_stack()
    body = b'{"model": "stub-model", "prompt": "hi", "max_tokens": 2, "zeta": [1, {"a": null}]}'
    reply = httpx.post(f"{gateway.url}/v1/completions", content=body,
                       headers={"content-type": "application/json"})
    assert reply.status_code == 200, reply.text
    (prefill,), (decode,) = engines["short"].requests, engines["decode"].requests
    expected = ["model", "prompt", "max_tokens", "zeta", *PD_KEYS]
    assert prefill["keys"] == decode["keys"] == expected
    assert prefill["room"] == decode["room"]


def test_a_clients_own_bootstrap_fields_are_replaced_by_the_gateways(pd_stack):
    gateway, engines = pd_stack()
    reply = httpx.post(f"{gateway.url}/v1/completions", json={
        "prompt": "hi", "bootstrap_host": "198.51.100.1", "bootstrap_port": 1, "bootstrap_room": 7})
    assert reply.status_code == 200, reply.text
    (prefill,), (decode,) = engines["short"].requests, engines["decode"].requests
    for seen in (prefill, decode):
        assert seen["keys"] == ["prompt", *PD_KEYS]  # one of each: the engines cannot mistake them
        assert (seen["bootstrap_host"], seen["bootstrap_port"]) == ("127.0.0.1", 9001)
    assert prefill["room"] == decode["room"] != 7
