"""The gateway's reading of a request body (laps_agent/serving/request_body.py), its refusals as
GatewayErrors: counted by reason, answered in the OpenAI error shape."""
from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from laps_agent.gateway.proxy.failures import GatewayError
from laps_agent.serving.request_body import BodyRefused, read_request_body


async def read_body(request: Request, limit: int, idle_s: float) -> bytes:
    """The whole body: 415 compressed, 413 over `limit` bytes, 408 stalled for `idle_s`,
    client_gone() when the client hung up mid-upload."""
    try:
        return await read_request_body(request, idle_s=idle_s, limit=limit)
    except BodyRefused as refused:
        raise GatewayError(refused.status, refused.reason, str(refused)) from None
    except ClientDisconnect:  # hung up mid-upload (a client timeout, a cancelled call): no bug here
        raise client_gone() from None


def client_gone() -> GatewayError:
    """The client hung up before its answer: counted as client_disconnected, never as a crash."""
    return GatewayError(499, "client_disconnected", "client went away")
