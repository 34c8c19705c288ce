"""The SGLang-free half of the SGLang plugin: configuration and the queue driver that keeps
LAPS's queues in step with a `waiting_queue` list (requests are plain stand-ins here; the real
SGLang runs in tests/sglang)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_agent.sglang_plugin.driver import QueueDriver
from laps_agent.sglang_plugin.settings import load_settings


@dataclass
class Req:
    rid: str
    prompt: int
    cached: int = 0
    extra: dict = field(default_factory=dict)


def driver(**config) -> QueueDriver:
    cfg = SchedulerConfig(**{"length_threshold": 100, "wait_window_ms": 0.0, **config})
    return QueueDriver(cfg, lambda req: (req.prompt, req.cached))


def test_plugin_is_off_unless_configured_and_env_mirrors_the_engine_flags(tmp_path):
    assert not load_settings({}).enabled
    s = load_settings({"LAPS_SCHEDULER": "1", "LAPS_LENGTH_THRESHOLD": "300", "LAPS_WAIT_WINDOW_MS": "7.5",
                       "LAPS_WAIT_MAX_BATCH": "4", "LAPS_ADAPTIVE_WINDOW": "true", "LAPS_MAX_LONG_WAIT_MS": "50"})
    assert s.enabled and s.scheduler.length_threshold == 300 and s.scheduler.wait_window_ms == 7.5
    assert s.scheduler.wait_max_batch == 4 and s.scheduler.adaptive_window and s.scheduler.max_long_wait_ms == 50
    # A file shaped like the CR's spec.laps turns it on; the environment overrides it.
    f = tmp_path / "laps.yaml"
    f.write_text("lengthThreshold: 64\nscheduler: {waitWindowMs: 3, maxLongWaitMs: 900}\n")
    s = load_settings({"LAPS_CONFIG_FILE": str(f), "LAPS_MAX_LONG_WAIT_MS": "100"})
    assert s.enabled and s.scheduler.length_threshold == 64 and s.scheduler.wait_window_ms == 3
    assert s.scheduler.max_long_wait_ms == 100
    with pytest.raises(ValueError, match="LAPS_SCHEDULER"):
        load_settings({"LAPS_SCHEDULER": "maybe"})
    # Every key of the CR's spec.laps is accepted, so the CR's own block can be the file.
    f.write_text("lengthThreshold: 64\nprefixCache: true\nprefixAffinity: true\nbatchPrefillGraphs: {}\n"
                 "allocation: {}\n")
    assert load_settings({"LAPS_CONFIG_FILE": str(f)}).scheduler.length_threshold == 64
    f.write_text("scheduler: {waitWindowMS: 3}\n")
    with pytest.raises(ValueError, match="waitWindowMS"):
        load_settings({"LAPS_CONFIG_FILE": str(f)})


def test_shorts_by_uncached_tokens_go_before_an_earlier_long_and_the_union_keeps_everyone():
    d = driver()
    long_, cached_long, short = Req("L", 500), Req("C", 500, cached=450), Req("S", 20)
    d.sync([long_, cached_long, short], now=0.0)
    assert {t.req.rid: t.cls for t in d.tracked.values()} == {"L": "long", "C": "short", "S": "short"}
    chosen = d.choose(1.0)
    assert [r.rid for r in chosen] == ["C", "S"]
    assert [r.rid for r in d.union()] == ["L"]
    # SGLang admitted only C: S goes back to the head of the short queue with its waiting time.
    assert [r.rid for r in d.settle(chosen, [short], 1.0)] == ["C"]
    assert [r.rid for r in d.union()] == ["S", "L"]
    assert [r.rid for r in d.choose(1.5)] == ["S"]  # L has waited 1.5 s < the 2 s bound


def test_requests_that_left_the_waiting_queue_leave_the_laps_queues():
    d = driver()
    a, b = Req("a", 10), Req("b", 10)
    d.sync([a, b], 0.0)
    d.sync([b], 0.1)  # SGLang aborted `a`
    assert [r.rid for r in d.choose(0.2)] == ["b"]
    assert d.choose(0.3) is None


def test_starvation_bound_lets_the_long_one_through_and_the_window_holds_shorts():
    d = driver(wait_window_ms=1000.0, max_long_wait_ms=10.0)
    d.sync([Req("L", 500), Req("s0", 10)], 0.0)
    d.sync([Req("L", 500), Req("s1", 10)], 0.001)   # s0 left (SGLang ran it): shorts keep coming
    assert [r.rid for r in d.choose(0.011)] == ["L"]
    assert d.last_decision.reason == "long_starved"
    assert d.choose(0.012) is None and d.last_decision.reason == "window_hold"


def test_waiting_counts_from_arrival_not_from_when_sglang_queued_the_request():
    # SGLang's scheduler reads new requests only between batches: behind a long prefill they
    # join its waiting queue seconds after they arrived. The bound counts from the arrival.
    arrivals = {"L": 0.0, "s": 0.5}
    d = QueueDriver(SchedulerConfig(length_threshold=100, wait_window_ms=0.0, max_long_wait_ms=2000.0),
                    lambda req: (req.prompt, req.cached), lambda req: arrivals[req.rid])
    d.sync([Req("s", 10), Req("L", 500)], now=9.0)
    assert d.tracked["L"].arrival == 0.0
    assert [r.rid for r in d.choose(9.0)] == ["L"] and d.last_decision.reason == "long_starved"


def test_a_typo_a_wrong_type_or_an_out_of_range_value_is_named(tmp_path):
    with pytest.raises(ValueError, match="LAPS_MAX_LONG_WAIT is not a LAPS plugin setting; did you mean LAPS_MAX_LONG_WAIT_MS"):
        load_settings({"LAPS_SCHEDULER": "1", "LAPS_MAX_LONG_WAIT": "100"})
    # Other LAPS_* names (another component's) are no typo of the plugin's.
    assert load_settings({"LAPS_SCHEDULER": "1", "LAPS_LOG_LEVEL": "debug"}).enabled
    with pytest.raises(ValueError, match=r"wait_window_ms must be >= 0, got -5.0 \(from LAPS_SCHEDULER, LAPS_WAIT_WINDOW_MS\)"):
        load_settings({"LAPS_SCHEDULER": "1", "LAPS_WAIT_WINDOW_MS": "-5"})
    with pytest.raises(ValueError, match="LAPS_METRICS_PORT='http': not a TCP port"):
        load_settings({"LAPS_SCHEDULER": "1", "LAPS_METRICS_PORT": "http"})
    f = tmp_path / "laps.yaml"
    for text, message in (("scheduler: {waitWindowMs: fast}", "scheduler.waitWindowMs must be a number, got 'fast'"),
                          ("scheduler: {adaptiveWindow: 'yes'}", "scheduler.adaptiveWindow must be true or false"),
                          ("lengthThreshold: 12.5", "lengthThreshold must be an integer, got 12.5"),
                          ("scheduler: [enabled]", "scheduler must be a mapping")):
        f.write_text(text + "\n")
        with pytest.raises(ValueError, match=re.escape(message)):
            load_settings({"LAPS_CONFIG_FILE": str(f)})
    # The CR's whole spec.laps block is a valid file, prefixWarm included.
    f.write_text("lengthThreshold: 64\nprefixWarm: false\n")
    assert load_settings({"LAPS_CONFIG_FILE": str(f)}).scheduler.length_threshold == 64
