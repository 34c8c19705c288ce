"""The body sent to the engines: the client's bytes with the PD fields spliced in."""
from __future__ import annotations

import json

import pytest

from laps_agent.gateway.proxy.payload import PDPayload

PD = {"bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 42}


def spliced(raw: bytes, host="10.0.0.7", port=8998, room=42) -> bytes:
    return b"".join(PDPayload(raw, json.loads(raw)).pieces(host, port, room))


@pytest.mark.parametrize("raw", [
    b'{"prompt": "hi", "max_tokens": 4}',
    b'  {"prompt":"caf\\u00e9 \xc3\xa9","stream":true}\r\n ',
    b'{"messages":[{"role":"user","content":"x"}],"n":1}',
    b'{}',
])
def test_the_engines_get_the_clients_fields_plus_the_pd_fields(raw):
    payload = spliced(raw)
    assert json.loads(payload) == {**json.loads(raw), **PD}


def test_the_clients_bytes_pass_through_untouched():
    raw = b'{"prompt": "caf\xc3\xa9\\n", "temperature": 0.50}'
    assert spliced(raw).startswith(raw[:-1])   # not re-encoded: spacing, escapes, 0.50 kept


def test_the_clients_own_bootstrap_fields_never_reach_the_engines():
    raw = b'{"prompt": "x", "bootstrap_room": 7, "bootstrap_host": "evil", "bootstrap_port": 1}'
    payload = spliced(raw)
    pairs = json.loads(payload, object_pairs_hook=list)
    assert sorted(k for k, _ in pairs) == ["bootstrap_host", "bootstrap_port", "bootstrap_room", "prompt"]
    assert json.loads(payload) == {"prompt": "x", **PD}


def test_a_body_in_another_encoding_is_re_encoded():
    raw = '{"prompt": "x"}'.encode("utf-16")  # json.loads takes it; splicing bytes would not
    assert json.loads(b"".join(PDPayload(raw, json.loads(raw)).pieces("h", None, 1))) == {
        "prompt": "x", "bootstrap_host": "h", "bootstrap_port": None, "bootstrap_room": 1}


def test_each_attempt_gets_its_own_room_from_one_payload():
    payload = PDPayload(b'{"prompt": "x"}', {"prompt": "x"})
    rooms = [json.loads(b"".join(payload.pieces("h", 1, room)))["bootstrap_room"] for room in (1, 2**63 - 1)]
    assert rooms == [1, 2**63 - 1]


def test_a_clients_rid_reaches_the_engines_unique_per_attempt_and_still_named():
    raw = b'{"text": "x", "rid": "job-1"}'
    payload = PDPayload(raw, json.loads(raw))
    sent = [json.loads(b"".join(payload.pieces("h", 1, room)), object_pairs_hook=list) for room in (255, 4096)]
    assert [dict(body)["rid"] for body in sent] == ["job-1-ff", "job-1-1000"]
    assert all([k for k, _ in body].count("rid") == 1 for body in sent)
    # One that is not a string stays as sent, for the engine to refuse by name.
    raw = b'{"text": "x", "rid": 7}'
    assert json.loads(b"".join(PDPayload(raw, json.loads(raw)).pieces("h", 1, 1)))["rid"] == 7


def test_a_batch_of_rids_gets_each_made_unique_per_attempt():
    """SGLang's /generate takes a list of prompts with a list of rids: each must be unique in
    the engine, as a single one must."""
    raw = b'{"text": ["a", "b"], "rid": ["job-1", "job-2"]}'
    payload = PDPayload(raw, json.loads(raw))
    sent = [json.loads(b"".join(payload.pieces("h", 1, room)))["rid"] for room in (255, 4096)]
    assert sent == [["job-1-ff", "job-2-ff"], ["job-1-1000", "job-2-1000"]]
    for odd in (b'{"text": ["a"], "rid": ["x", 7]}', b'{"text": [], "rid": []}'):  # the engine's to refuse
        assert json.loads(b"".join(PDPayload(odd, json.loads(odd)).pieces("h", 1, 1)))["rid"] == json.loads(odd)["rid"]
