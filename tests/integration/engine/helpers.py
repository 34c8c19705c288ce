from __future__ import annotations

import json
import random

import httpx

from tests.support.metrics_text import metric_value
from tests.support.waiting import poll


def wait_for(condition, timeout: float = 20.0, message: str = "condition"):
    return poll(condition, timeout=timeout, message=message)


def engine_state(engine) -> dict:
    return httpx.get(engine.url + "/get_server_info", timeout=10).json()


def engine_idle(engine) -> bool:
    info = engine_state(engine)
    state = info["state"]
    return (state["live"] == 0 and state["kv_usage"] == 0.0 and info["bootstrap"]["pending_rooms"] == 0
            and info["bootstrap"]["fetching"] == 0)


def client_disconnects(engine) -> float:
    """Requests whose client hung up before its whole answer, as the engine counts them."""
    page = httpx.get(engine.url + "/metrics", timeout=10).text
    return metric_value(page, "laps_engine_client_disconnects_total")


def room() -> int:
    return random.getrandbits(63)


def pd_body(body: dict, prefill, room_id: int) -> dict:
    return {**body, "bootstrap_host": prefill.host, "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": room_id}


def sse_events(text: str) -> list:
    events = []
    for block in text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
