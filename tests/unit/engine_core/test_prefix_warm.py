"""Prefix warming's queue (engine/core/warm_queue.py): bounded, oldest dropped first, chunks of whole
pages no bigger than the length threshold, and a warm always ends."""
from __future__ import annotations

import pytest

from laps_agent.engine.core.warm_queue import MAX_QUEUED_WARMS, Warm, WarmQueue
from laps_agent.engine.pd.prefix_warm import parse_warm_body


def test_a_flood_of_warms_keeps_the_newest_and_reports_the_dropped():
    reports: list = []
    queue = WarmQueue(16, 256, lambda outcome, n: reports.append(outcome))
    for i in range(MAX_QUEUED_WARMS + 5):
        queue.add(Warm(list(range(40)), 40, rid=f"w{i}"))
    assert len(queue) == MAX_QUEUED_WARMS and reports == ["dropped"] * 5
    warm, start, end = queue.next_chunk(lambda w: 0)
    assert warm.rid == "w5" and (start, end) == (0, 32)     # the oldest kept; whole pages only


def test_chunks_follow_the_cache_and_the_warm_ends_even_if_its_pages_are_evicted():
    reports: list = []
    queue = WarmQueue(16, 100, lambda outcome, n: reports.append((outcome, n)))
    queue.add(Warm(list(range(250)), 250))
    held = {"tokens": 64}                                      # the previous prompt is cached
    chunks = []
    while (chunk := queue.next_chunk(lambda w: held["tokens"])) is not None:
        warm, start, end = chunk
        chunks.append((start, end))
        queue.advance(warm, end, end - start)
        held["tokens"] = 0                                     # evicted at once: pos still moves on
    assert chunks == [(64, 160), (160, 240)]                   # <= 96 (6 pages) each, ends at 240
    assert reports == [("chunk", 96), ("chunk", 80), ("done", 0)]


@pytest.mark.parametrize("raw, reason", [
    (b"not json", "JSON object"), (b'{"input_ids": []}', "non-empty"),
    (b'{"input_ids": [1, 99999]}', "[0, 1000)"), (b'{"input_ids": [1, 2, 3, 4]}', "at most 3"),
])
def test_bad_warm_bodies_are_refused_with_the_reason(raw, reason):
    with pytest.raises(ValueError, match=reason.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_warm_body(raw, vocab_size=1000, max_tokens=3)


def test_a_warm_to_an_engine_that_is_gone_is_lost_quietly():
    import asyncio

    from laps_agent.engine.pd.prefix_warm import send_warm
    from laps_agent.local.engines import free_ports

    # Nothing listens there: no exception reaches the decode engine, the status says "no answer".
    (port,) = free_ports(1)
    assert asyncio.run(send_warm("127.0.0.1", port, [1, 2, 3], timeout_s=2.0)) == 0
