"""The gateway's body parser (gateway/payload.py: a fast parser, json.loads for what it refuses):
a client sees json.loads' verdict on every body, accepted or refused with its reason."""
from __future__ import annotations

import json

import pytest

from laps_agent.gateway.proxy.failures import GatewayError
from laps_agent.gateway.proxy.payload import parse_body

ACCEPTED = [
    b'{"prompt": "plain text", "max_tokens": 4}',
    '{"prompt": "ünïcödé 😀 \\u00e9 \\ud83d\\ude00"}'.encode(),
    b'{"n": 123456789012345678901234567890, "x": -0.0, "y": 1e400, "z": 0.1}',
    b'{"a": 1, "a": 2}',                                   # duplicate keys: the last wins
    b' \r\n\t{"prompt": "x"}\n ',
    b'{"t": NaN, "u": -Infinity}',                         # json.loads' extensions
    '{"prompt": "utf-16 body"}'.encode("utf-16"),          # json.loads detects UTF-16/32
    b'\xef\xbb\xbf{"prompt": "utf-8 with a BOM"}',
    b'{"deep": ' + b"[" * 400 + b"]" * 400 + b"}",         # deeper than the fast parser goes
]


@pytest.mark.parametrize("raw", ACCEPTED, ids=range(len(ACCEPTED)))
def test_every_body_json_loads_accepts_parses_to_the_same_object(raw):
    body, expected = parse_body(raw), json.loads(raw)
    assert json.dumps(body) == json.dumps(expected)     # NaN-safe equality, types included
    assert [type(v) for v in body.values()] == [type(v) for v in expected.values()]


def _refused(raw: bytes) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse_body(raw)
    assert caught.value.status == 400
    return caught.value


def test_malformed_json_is_refused_with_json_loads_reason():
    for raw in (b'{"prompt": "x"', b'{"prompt": "x"} trailing', b'{"a": "x\x01y"}', b"\xff{}"):
        error = _refused(raw)
        assert error.reason == "bad_json" and error.message.startswith("request body is not valid JSON: ")
    assert "Expecting ',' delimiter" in _refused(b'{"a": 1 "b": 2}').message


def test_a_body_that_is_not_an_object_is_refused_as_such():
    for raw in (b'["a list"]', b'"a string"', b"42", '["\\ud800"]'.encode()):
        error = _refused(raw)
        assert (error.reason, error.message) == ("bad_json", "request body must be a JSON object")


def test_nesting_past_json_loads_own_limit_is_refused():
    error = _refused(b'{"deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert error.message == "request body is nested too deeply"


def test_lone_surrogates_are_refused_naming_where_they_are():
    for raw, where in ((rb'{"prompt": "a\ud800b"}', "prompt"),
                       (rb'{"messages": [{"role": "user", "content": "x\uDFFF"}]}', "messages[0].content"),
                       (b'{"text": "\xed\xa0\x80"}', "text")):
        error = _refused(raw)
        assert error.reason == "invalid_request" and where in error.message
