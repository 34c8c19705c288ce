"""Decode admission by deadline (policy/scheduling/decode_order.py): which request whose KV has
arrived takes a free decode slot. The policy, and the emulated engine model that `laps sim` and
the emulated engines run (the builtin engine's: tests/integration/engine/test_engine_loop.py)."""
from __future__ import annotations

from laps_agent.emulated.core import EngineModel
from laps_agent.emulated.profile import parse_profile
from laps_agent.emulated.requests import ModelRequest
from laps_agent.engine.flags import build_parser, decode_order
from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_agent.policy.scheduling.decode_order import DecodeOrder, next_admitted

ORDER = DecodeOrder.from_slo({"short": 0.5, "long": 3.0}, length_threshold=256)
SHORT_PROMPT, LONG_PROMPT = 100, 2000


def test_a_short_prompt_is_due_sooner_than_a_long_one_received_with_it():
    assert ORDER.deadline(10.0, SHORT_PROMPT) == 10.5
    assert ORDER.deadline(10.0, LONG_PROMPT) == 13.0
    assert ORDER.deadline(10.0, 256) == 10.5   # the length threshold's own rule: <= is short


def test_the_free_slot_goes_to_the_first_token_due_first():
    waiting = {"long": ORDER.deadline(0.0, LONG_PROMPT), "short": ORDER.deadline(1.0, SHORT_PROMPT)}
    assert next_admitted(waiting, waiting.__getitem__, now=1.2) == "short"
    assert next_admitted({}, lambda w: 0.0, now=1.2) is None


def test_a_request_already_late_waits_behind_those_still_in_time():
    # At 2.0 the short one (due 1.5) is late whatever happens; the long one (due 3.0) is not yet.
    waiting = {"short": ORDER.deadline(1.0, SHORT_PROMPT), "long": ORDER.deadline(0.0, LONG_PROMPT)}
    assert next_admitted(waiting, waiting.__getitem__, now=2.0) == "long"
    # Once every one is late, the earliest deadline first.
    assert next_admitted(waiting, waiting.__getitem__, now=4.0) == "short"


def test_equal_deadlines_keep_arrival_order():
    waiting = {name: 5.0 for name in ("first", "second", "third")}
    assert next_admitted(waiting, waiting.__getitem__, now=0.0) == "first"


PROFILE = parse_profile({
    "name": "one-slot", "provenance": "synthetic", "model": {"name": "m", "kv_bytes_per_token": 1000},
    "engine": {"kv_capacity_tokens": 65536, "page_size": 16, "context_length": 8192, "max_running_requests": 1},
    "prefill": {"overhead_s": 0.010, "per_token_s": 0.0001},
    "decode": {"overhead_s": 0.020, "per_request_s": 0.0, "per_context_token_s": 0.0},
    "transfer": {"latency_s": 0.001, "bytes_per_s": 1.0e9}})


def first_tokens(order: DecodeOrder | None) -> list[str]:
    """A decode engine of one slot, busy with a 10-token answer; a long prompt's KV arrives,
    then a short one's: the order in which they get their first token."""
    m = EngineModel(PROFILE, "decode", SchedulerConfig(), decode_order=order)
    m.add(ModelRequest("busy", "decode", SHORT_PROMPT, 10, 0.0), 0.0)
    assert [e.rid for e in m.poll(0.0)] == ["busy"]   # its first token: it holds the slot
    m.add(ModelRequest("long", "decode", LONG_PROMPT, 2, 0.01), 0.01)
    m.add(ModelRequest("short", "decode", SHORT_PROMPT, 2, 0.02), 0.02)
    events = list(m.poll(0.02))
    while (t := m.next_time()) is not None:
        events += m.poll(t)
    return [e.rid for e in events if e.kind == "token" and e.tokens == 1]


def test_the_emulated_decode_engine_serves_the_short_prompt_first_when_a_slot_frees():
    assert first_tokens(ORDER) == ["short", "long"]


def test_without_the_laps_scheduler_a_decode_engine_admits_in_arrival_order():
    """vanilla PD: `--no-laps-scheduler` (the flags `laps local` and `laps sim` give vanilla-pd)
    means no deadline order, as stock SGLang's decode server; so does `--decode-order fifo`."""
    assert decode_order(build_parser().parse_args(["--no-laps-scheduler"])) is None
    assert decode_order(build_parser().parse_args(["--decode-order", "fifo"])) is None   # the reference's
    assert first_tokens(None) == ["long", "short"]
    given = decode_order(build_parser().parse_args(["--slo", "short=0.2,long=9", "--length-threshold", "64"]))
    assert given == DecodeOrder({"short": 0.2, "long": 9.0}, 64)
