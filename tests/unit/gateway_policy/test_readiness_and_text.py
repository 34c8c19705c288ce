"""Readiness of the gateway (a usable prefill and decode pod) and the check for text no
tokenizer can encode (lone surrogates), both pure."""
from __future__ import annotations

import json

from laps_agent.gateway.discovery.membership import Membership
from laps_agent.gateway.http.status import readiness
from laps_agent.modelio.tokenizer import unencodable_text
from laps_agent.policy.routing import Endpoint, EndpointLoad


def ep(name: str) -> Endpoint:
    return Endpoint(name, f"http://{name}:30000", name, 8998)


def test_ready_with_a_prefill_pod_in_either_group_and_a_decode_pod():
    m = Membership(groups={"short": (), "long": (ep("l0"),)}, decode=(ep("d0"),))
    assert readiness(m, {}) == (True, "")


def test_not_ready_names_what_is_missing():
    ready, reason = readiness(Membership(), {})
    assert not ready and "no prefill pod discovered" in reason and "no decode pod discovered" in reason
    m = Membership(groups={"short": (ep("s0"),), "long": ()}, decode=(ep("d0"),))
    ready, reason = readiness(m, {"d0": EndpointLoad(healthy=False)})
    assert not ready and reason == "no usable decode pod (1 discovered, all ejected after failures or draining)"


def _where(raw: bytes):
    return unencodable_text(raw, json.loads(raw))


def test_lone_surrogates_are_found_where_they_are():
    assert _where(rb'{"prompt": "a\ud800b"}') == "prompt"
    assert _where(rb'{"messages": [{"role": "user", "content": "x\uDFFF"}]}') == "messages[0].content"
    assert _where(b'{"text": "\xed\xa0\x80"}') == "text"  # surrogate bytes json.loads lets through
    assert _where(rb'{"\ud800": 1}') == "a key of body"


def test_valid_text_passes_including_escaped_surrogate_pairs():
    assert _where(rb'{"prompt": "\ud83d\ude00 and \u00e9", "stop": ["\\ud800"]}') is None
    assert _where('{"prompt": "plain ünïcödé 😀"}'.encode()) is None
