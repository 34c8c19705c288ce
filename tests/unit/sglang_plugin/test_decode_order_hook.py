"""The plugin's decode half, SGLang-free: a decode server's waiting requests (their KV arrived)
put in first-token deadline order (policy/scheduling/decode_order.py), as the builtin engine
admits them; its settings. On a real SGLang decode server: tests/sglang/test_pd_plugin.py."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from laps_agent.sglang_plugin.hooks import decode_queue_order
from laps_agent.sglang_plugin.settings import load_settings


@dataclass
class Req:
    rid: str
    prompt: int
    arrived: float
    retraction_count: int = 0
    time_stats: SimpleNamespace = field(init=False)

    def __post_init__(self) -> None:
        self.origin_input_ids = [1] * self.prompt
        # The tokenizer side's dispatch stamp (perf_counter), as the plugin sends it along.
        self.time_stats = SimpleNamespace(api_server_dispatch_time=self.arrived)


def order(**env):
    return load_settings({"LAPS_SCHEDULER": "1", "LAPS_LENGTH_THRESHOLD": "256", **env}).decode_order


def test_a_decode_server_gives_its_free_slots_to_the_first_tokens_due_first():
    now = time.perf_counter()
    waiting = [Req("long", 2000, now - 0.2), Req("short", 100, now - 0.1)]
    assert [r.rid for r in decode_queue_order(order(), waiting, now)] == ["short", "long"]
    # A short one already past its 0.5 s goes behind a long one still in time.
    waiting = [Req("long", 2000, now - 0.2), Req("late short", 100, now - 0.8)]
    assert [r.rid for r in decode_queue_order(order(), waiting, now)] == ["long", "late short"]


def test_requests_resumed_after_a_retraction_keep_going_first():
    now = time.perf_counter()
    waiting = [Req("short", 100, now - 0.1), Req("resumed", 2000, now - 30, retraction_count=1)]
    assert [r.rid for r in decode_queue_order(order(), waiting, now)] == ["resumed", "short"]


def test_the_decode_order_follows_the_slo_it_is_given_and_can_be_left_to_sglang():
    now = time.perf_counter()
    waiting = [Req("long", 2000, now - 0.2), Req("short", 100, now - 0.1)]
    # Equal SLOs: arrival order.
    assert [r.rid for r in decode_queue_order(order(LAPS_SLO="all=5"), waiting, now)] == ["long", "short"]
    assert order(LAPS_DECODE_ORDER="fifo") is None
    assert load_settings({}).decode_order is None   # the plugin off: SGLang's own order
    with pytest.raises(ValueError, match="LAPS_SLO"):
        order(LAPS_SLO="short=fast")
    with pytest.raises(ValueError, match="LAPS_DECODE_ORDER"):
        order(LAPS_DECODE_ORDER="lifo")
