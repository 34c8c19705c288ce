"""Whose failure an engine's error answer is: a decode engine that waited in vain for its KV
blames the prefill pod (not retried, 503 naming the group); anything else the pod that answered;
the engine's own verdicts on a request pass through."""
from __future__ import annotations

import json

import pytest

from laps_agent.gateway.proxy.failures import judge_status


def _body(kind: str | None, message: str = "KV for bootstrap_room 7 did not arrive") -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": 504}}).encode()


def _judge(role: str, status: int, body: bytes):
    return judge_status(role, status, body, prefill="p-long-0", group="long", decode="d-0")


def test_a_decode_engine_s_kv_timeout_is_the_prefill_group_s_overload():
    blame = _judge("decode", 504, _body("bootstrap_error"))
    assert (blame.role, blame.retry, blame.status, blame.reason) == ("prefill", False, 503, "prefill_overloaded")
    assert blame.message.startswith("the long prefill group is overloaded")
    assert "p-long-0" in blame.message and "did not arrive" in blame.message


def test_a_prefill_engine_s_kv_timeout_is_the_decode_pod_s_failure():
    blame = _judge("prefill", 504, _body("bootstrap_error", "no decode engine collected it"))
    assert (blame.role, blame.retry, blame.status) == ("decode", True, 502)
    assert "d-0" in blame.message


@pytest.mark.parametrize("body", [_body("engine_error"), b"", b"<html>gateway timeout</html>",
                                  b'{"error": "text"}', b"[1]"])
def test_a_504_that_is_not_an_engine_s_kv_timeout_counts_against_the_pod_that_answered(body):
    blame = _judge("decode", 504, body)
    assert (blame.role, blame.retry, blame.status, blame.reason) == ("decode", True, 502, "upstream_unavailable")


def test_a_503_or_502_counts_against_the_pod_that_answered_and_is_retried():
    for status in (502, 503):
        for role in ("prefill", "decode"):
            blame = _judge(role, status, _body("bootstrap_error"))
            assert (blame.role, blame.retry) == (role, True)


@pytest.mark.parametrize("status", [400, 404, 413, 422, 429, 500])
def test_the_engine_s_own_verdict_passes_through(status):
    assert _judge("decode", status, _body("invalid_request_error")) is None


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_draining_engine_s_refusal_is_retried_and_is_no_failure(role):
    blame = _judge(role, 503, _body("draining", "this engine is draining (shutting down)"))
    assert (blame.role, blame.retry, blame.status, blame.state) == (role, True, 503, "draining")
    assert blame.reason == "upstream_draining" and "draining" in blame.message


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_full_engine_queue_is_retried_elsewhere_and_leaves_the_pod_healthy(role):
    blame = _judge(role, 503, _body("queue_full", "engine queue full (256 waiting, bound 256)"))
    assert (blame.role, blame.retry, blame.status, blame.state) == (role, True, 503, "busy")
    assert "engine queue full (256 waiting, bound 256)" in blame.message


def test_only_a_503_says_draining_or_full():
    for kind in ("draining", "queue_full"):
        assert _judge("decode", 502, _body(kind)).state == "failing"
