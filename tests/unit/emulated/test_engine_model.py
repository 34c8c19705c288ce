"""The engine model (shared by the emulated engine and `laps sim`): batches take the profile's
time, the real LAPS scheduler orders them, decode and KV limits behave as the builtin engine's."""
from __future__ import annotations

import pytest

from laps_agent.emulated.core import EngineModel
from laps_agent.emulated.profile import ProfileError, load_profile, parse_profile
from laps_agent.emulated.requests import ModelRequest
from laps_agent.policy.scheduling.buckets import BucketGrid
from laps_agent.policy.scheduling.config import SchedulerConfig

BASE = {
    "name": "test", "provenance": "synthetic",
    "model": {"name": "m", "kv_bytes_per_token": 1000},
    "engine": {"kv_capacity_tokens": 4096, "page_size": 16, "context_length": 4096,
               "max_running_requests": 4},
    "prefill": {"overhead_s": 0.010, "per_token_s": 0.001},
    "decode": {"overhead_s": 0.020, "per_request_s": 0.001, "per_context_token_s": 0.0},
    "transfer": {"latency_s": 0.001, "bytes_per_s": 1.0e6},
}


def profile(**changes):
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for path, value in changes.items():
        section, key = path.split("__")
        data[section][key] = value
    return parse_profile(data)


def run_until_idle(model: EngineModel, start: float = 0.0) -> list:
    """Drive the model as a driver would: poll at every time it asks for."""
    events = list(model.poll(start))
    while (t := model.next_time()) is not None:
        events += model.poll(t)
    return events


def firsts(events) -> dict:
    return {e.rid: e.time for e in events if e.kind in ("token", "prefilled") and e.tokens == 1}


def test_a_prefill_batch_takes_the_profile_time():
    m = EngineModel(profile(), "prefill", SchedulerConfig(wait_window_ms=0))
    m.add(ModelRequest("a", "prefill", 100, 8, 0.0), 0.0)
    events = run_until_idle(m)
    assert [(e.rid, e.kind, e.finished) for e in events] == [("a", "prefilled", True)]
    assert events[0].time == pytest.approx(0.010 + 0.001 * 100)


def test_short_requests_overtake_a_long_one_that_arrived_first():
    m = EngineModel(profile(), "prefill", SchedulerConfig(wait_window_ms=0, length_threshold=64))
    m.add(ModelRequest("long", "prefill", 1000, 1, 0.0), 0.0)
    m.add(ModelRequest("s1", "prefill", 10, 1, 0.0), 0.0)
    m.add(ModelRequest("s2", "prefill", 20, 1, 0.0), 0.0)
    done = firsts(run_until_idle(m))
    assert done["s1"] == done["s2"] < done["long"]  # one short batch, then the long one
    assert done["s1"] == pytest.approx(0.010 + 0.001 * 30)
    assert done["long"] == pytest.approx(done["s1"] + 0.010 + 1.0)


def test_fifo_mode_serves_in_arrival_order():
    m = EngineModel(profile(), "prefill", SchedulerConfig(enabled=False, max_batch_size=1))
    for rid, tokens in (("long", 1000), ("s1", 10)):
        m.add(ModelRequest(rid, "prefill", tokens, 1, 0.0), 0.0)
    done = firsts(run_until_idle(m))
    assert done["long"] < done["s1"]


def test_short_batches_use_the_graph_bucket_when_the_device_replays_graphs():
    p = profile(prefill__graph={"overhead_s": 0.002, "per_token_s": 0.0005})
    grid = BucketGrid([1, 2, 4], [16, 32, 64, 128])
    records = []
    m = EngineModel(p, "prefill", SchedulerConfig(wait_window_ms=0), grid, on_prefill=records.append)
    m.add(ModelRequest("a", "prefill", 100, 1, 0.0), 0.0)
    m.add(ModelRequest("b", "prefill", 30, 1, 0.0), 0.0)
    events = run_until_idle(m)
    # one batch of 2 in bucket (2, 128): overhead + per padded token
    assert records[0].path == "graph" and records[0].padded_tokens == 256 and records[0].real_tokens == 130
    assert events[0].time == pytest.approx(0.002 + 0.0005 * 256)


def test_without_graphs_a_wasteful_bucket_is_not_taken():
    grid = BucketGrid([1, 2, 4], [16, 32, 64, 128])
    records = []
    m = EngineModel(profile(), "prefill", SchedulerConfig(wait_window_ms=0), grid, on_prefill=records.append)
    for rid, tokens in (("a", 100), ("b", 30)):  # bucket (2, 128) pads 130 real tokens to 256
        m.add(ModelRequest(rid, "prefill", tokens, 1, 0.0), 0.0)
    run_until_idle(m)
    assert records[0].path == "eager" and records[0].padded_tokens == 130


def test_the_waiting_window_batches_short_requests():
    m = EngineModel(profile(), "prefill", SchedulerConfig(wait_window_ms=5, wait_max_batch=8))
    for t in (-0.009, -0.006, -0.003):   # shorts have been arriving every 3 ms: more are expected
        m.scheduler.window.note_short_arrival(t, 10)
    m.add(ModelRequest("a", "prefill", 10, 1, 0.0), 0.0)
    assert m.poll(0.0) == [] and m.next_time() == pytest.approx(0.005)  # held for the window
    m.add(ModelRequest("b", "prefill", 10, 1, 0.003), 0.003)
    done = firsts(run_until_idle(m, 0.003))
    # Together; at b's arrival, as no third is expected before the window ends (3 ms apart).
    assert done["a"] == done["b"] == pytest.approx(0.003 + 0.010 + 0.020)


def test_decode_admits_at_iteration_boundaries_and_counts_tokens():
    m = EngineModel(profile(), "decode", SchedulerConfig())
    m.add(ModelRequest("a", "decode", 100, 3, 0.0), 0.0)
    events = run_until_idle(m)
    assert [(e.tokens, e.finished) for e in events] == [(1, False), (2, False), (3, True)]
    step = 0.020 + 0.001 * 1
    assert [e.time for e in events] == pytest.approx([0.0, step, 2 * step])
    m.add(ModelRequest("b", "decode", 100, 2, 0.0), 0.0)  # idle engine: admitted at once
    assert firsts(m.poll(0.5)) == {"b": 0.5}


def test_a_request_arriving_mid_step_waits_for_the_step_to_end():
    m = EngineModel(profile(), "decode", SchedulerConfig())
    m.add(ModelRequest("a", "decode", 100, 10, 0.0), 0.0)
    m.poll(0.0)
    m.add(ModelRequest("b", "decode", 100, 2, 0.005), 0.005)
    assert m.poll(0.005) == []
    assert firsts(m.poll(0.021)) == {"b": pytest.approx(0.021)}


def test_token_events_off_gives_the_same_first_and_last_times():
    def times(token_events: bool):
        m = EngineModel(profile(), "mixed", SchedulerConfig(wait_window_ms=0), token_events=token_events)
        for i, (tokens, out) in enumerate(((50, 5), (300, 3), (20, 8))):
            m.add(ModelRequest(str(i), "generate", tokens, out, 0.0), 0.0)
        events = run_until_idle(m)
        return firsts(events), {e.rid: (e.time, e.tokens) for e in events if e.finished}

    assert times(True) == times(False)


def test_max_running_bounds_decoding_requests():
    m = EngineModel(profile(), "decode", SchedulerConfig(), max_running=2)
    for i in range(3):
        m.add(ModelRequest(str(i), "decode", 10, 4, 0.0), 0.0)
    assert set(firsts(m.poll(0.0))) == {"0", "1"}
    assert m.snapshot()["waiting_kv"] == 1


def test_kv_pages_bound_a_prefill_batch_and_the_rest_waits():
    # 10 pages of 16 tokens: one 120-token prompt (8 pages) fits, a second one must wait.
    m = EngineModel(profile(), "prefill", SchedulerConfig(wait_window_ms=0), kv_pages=10)
    m.add(ModelRequest("a", "prefill", 120, 1, 0.0), 0.0)
    m.add(ModelRequest("b", "prefill", 120, 1, 0.0), 0.0)
    done = firsts(run_until_idle(m))
    assert done["b"] == pytest.approx(2 * done["a"])
    assert m.free_pages == 10


def test_abort_frees_everything():
    m = EngineModel(profile(), "decode", SchedulerConfig())
    m.add(ModelRequest("a", "decode", 100, 50, 0.0), 0.0)
    m.poll(0.0)
    assert m.abort("a") and not m.abort("a")
    assert m.free_pages == m.num_pages and run_until_idle(m, 1.0) == []


@pytest.mark.parametrize("kind", ["generate", "decode"])
@pytest.mark.parametrize("limit", ["context", "pool"])
def test_prompt_and_completion_never_pass_the_context(kind, limit):
    """As the builtin engine (and OpenAI, vLLM, SGLang): a request asking for more than its
    context leaves stops with prompt + completion == the context, the smaller of the context
    length and the KV pool; it used to get one token more."""
    sizes = {"context_len": 64} if limit == "context" else {"kv_pages": 4}  # 4 pages of 16 tokens
    m = EngineModel(profile(), "mixed" if kind == "generate" else "decode", SchedulerConfig(wait_window_ms=0),
                    **sizes)
    for prompt in (63, 62, 50):
        m.add(ModelRequest(f"p{prompt}", kind, prompt, 100, 0.0), 0.0)
    done = {e.rid: e.tokens for e in run_until_idle(m) if e.finished}
    assert done == {"p63": 1, "p62": 2, "p50": 14}
    assert m.free_pages == m.num_pages
    [refused] = m.add(ModelRequest("full", kind, 64, 1, 0.0), 0.0)  # no room for one token
    # The builtin engine's refusal, word for word (what a client of either engine reads).
    assert refused.kind == "error" and refused.error == (
        "the prompt has 64 tokens; this engine takes at most 63: prompt + completion must fit in "
        "its context of 64 tokens")


def test_too_long_a_prompt_is_refused():
    m = EngineModel(profile(), "prefill", SchedulerConfig())
    [event] = m.add(ModelRequest("a", "prefill", 5000, 1, 0.0), 0.0)
    assert event.kind == "error" and "5000 tokens" in event.error


def test_profiles_ship_and_bad_ones_name_the_field(tmp_path):
    assert load_profile("cpu-smollm2").provenance.startswith("fitted")
    with pytest.raises(ProfileError, match="unknown profile 'nope'"):
        load_profile("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nprovenance: y\nmodel: {name: m, kv_bytes_per_token: 1}\n"
                   "engine: {kv_capacity_tokens: 10, context_length: 10}\n"
                   "prefill: {overhead_s: -1, per_token_s: 0}\ndecode: {overhead_s: 0}\n"
                   "transfer: {bytes_per_s: 1}\n")
    with pytest.raises(ProfileError, match=r"bad.yaml: prefill.overhead_s"):
        load_profile(bad)


def test_the_load_report_counts_a_prefill_batch_while_it_runs_and_the_queue_behind_it():
    from laps_agent.engine.core.load_report import load_report

    m = EngineModel(profile(), "prefill", SchedulerConfig(wait_window_ms=0, length_threshold=64))
    m.add(ModelRequest("long", "prefill", 1000, 1, 0.0), 0.0)
    m.poll(0.0)                                   # the long batch starts: 1.01 s
    m.add(ModelRequest("short", "prefill", 10, 1, 0.0), 0.1)
    report = load_report("prefill", m.snapshot(), fetching=0)
    assert (report["waiting_requests"], report["pending_tokens"]) == (2, 1010)
    run_until_idle(m, 0.1)
    assert load_report("prefill", m.snapshot(), fetching=0) == {
        "role": "prefill", "waiting_requests": 0, "pending_tokens": 0, "running_requests": 0,
        "transfer_requests": 0, "short_pending": [0, 0], "max_prefill_tokens": 8192, "max_long_batch_tokens": 4096,
        "prefill_cost": {"overhead_s": pytest.approx(0.010), "per_token_s": pytest.approx(0.001)}}


def test_a_prefill_engine_reports_what_it_prefills_within_half_its_hand_off_timeout():
    """The gateway admits to a prefill pod by this figure (gateway/admission.py in_time): the
    engine measures its own cost per batch and per token, so the figure follows the hardware."""
    from laps_agent.engine.core.load_report import load_report

    m = EngineModel(profile(), "prefill", SchedulerConfig(wait_window_ms=0, length_threshold=64))
    assert "max_pending_tokens" not in load_report("prefill", m.snapshot(), 0, bootstrap_timeout_s=30)
    at = 0.0
    for rid, tokens in (("a", 1000), ("b", 200)):   # two sizes: overhead and per-token cost apart
        m.add(ModelRequest(rid, "prefill", tokens, 1, at), at)
        at = max(e.time for e in run_until_idle(m, at))
    # The profile: 0.01 s per batch + 0.001 s per token; half of 30 s holds (15 - 0.01) / 0.001.
    assert load_report("prefill", m.snapshot(), 0, bootstrap_timeout_s=30)["max_pending_tokens"] == \
        pytest.approx(14990, abs=2)
    # A decode engine prefills nothing for the gateway to bound.
    assert "max_pending_tokens" not in load_report("decode", m.snapshot(), 0, bootstrap_timeout_s=30)


def test_a_calibrated_prefill_engine_reports_its_figure_before_any_request():
    """As `laps engine` measures its speed at start-up (engine/calibration.py), the emulated and
    simulated engines take theirs from the profile: a fresh cluster's first burst is admitted by
    it. A decode engine, which prefills nothing, is left as it was."""
    from laps_agent.emulated.prefill_cost import calibrate
    from laps_agent.engine.core.load_report import load_report

    config = SchedulerConfig(wait_window_ms=0, length_threshold=64)
    prefill, decode = EngineModel(profile(), "prefill", config), EngineModel(profile(), "decode", config)
    calibrate(prefill)
    calibrate(decode)
    assert load_report("prefill", prefill.snapshot(), 0, bootstrap_timeout_s=30)["max_pending_tokens"] == \
        pytest.approx(14990, abs=2)   # the same figure as measured from real batches above
    assert decode.snapshot()["prefill_cost"] is None
