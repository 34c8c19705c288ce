"""The gateway's admission refusal as a client sees it (gateway/admission.py): 429, a
Retry-After, and a message naming what is overloaded."""
from __future__ import annotations

import httpx


def admission_refusal(reply: httpx.Response, reason_start: str) -> str:
    """'429' for a refusal of this shape whose message starts with `reason_start` (the group or
    the decode pool); an assertion error naming what differs otherwise."""
    assert reply.status_code == 429, reply.text
    message = reply.json()["error"]["message"]
    assert int(reply.headers["retry-after"]) >= 1, reply.headers
    assert message.startswith(reason_start), message
    return "429"
