"""The engine loop in-process with the tiny model and the real runner (no HTTP)."""
from __future__ import annotations

import queue
import time

import pytest

from laps_agent.engine.core.requests import EngineOutput, GenerateWork
from laps_agent.engine.engine import Engine, EngineConfig
from laps_agent.engine.model.sampling import SamplingParams
from laps_agent.policy.scheduling.buckets import BucketGrid
from laps_agent.policy.scheduling.config import SchedulerConfig


@pytest.fixture
def make_engine(tiny_loaded):  # tiny_loaded: tests/support/fixtures_models.py
    from laps_agent.engine.model.runner import ModelRunner

    started: list[Engine] = []

    def make(num_pages: int = 256, bucketed: str = "auto", prefix_cache: bool = True, context_len: int = 4096,
             **sched) -> tuple[Engine, list]:
        grid = BucketGrid([1, 2, 4, 8], [16, 32, 64, 128, 256])
        runner = ModelRunner(tiny_loaded, num_pages=num_pages, page_size=16, grid=grid)
        records: list = []
        engine = Engine(runner, tiny_loaded.tokenizer,
                        EngineConfig(scheduler=SchedulerConfig(**sched), context_len=context_len,
                                     batch_prefill_graphs_mode=bucketed, prefix_cache=prefix_cache),
                        grid=grid, on_prefill=records.append)
        engine.start()
        started.append(engine)
        return engine, records

    yield make
    for engine in started:
        engine.stop()


def collect(outs: queue.Queue, n: int, timeout: float = 60.0) -> dict[str, list[EngineOutput]]:
    """Outputs per rid until `n` requests finished."""
    got: dict[str, list[EngineOutput]] = {}
    done = 0
    deadline = time.monotonic() + timeout
    while done < n:
        out = outs.get(timeout=max(deadline - time.monotonic(), 0.01))
        got.setdefault(out.rid, []).append(out)
        done += out.finished
    return got


def prompt(n: int, start: int = 20) -> list[int]:
    return [start + (i % 300) for i in range(n)]


def test_short_requests_arriving_together_share_one_prefill_batch(make_engine):
    engine, records = make_engine(bucketed="always")
    outs: queue.Queue = queue.Queue()
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    engine.submit_many([(GenerateWork(f"r{i}", prompt(10 + 7 * i), params), outs.put) for i in range(6)])
    got = collect(outs, 6)
    assert all(o[-1].finish_reason == "length" and o[-1].completion_tokens == 5 for o in got.values())
    assert records[0].size == 6 and records[0].bucketed and records[0].cls == "short"
    assert engine.kv.free_pages == engine.kv.num_pages
    engine.kv.self_check()


def test_without_cuda_graphs_auto_packs_batches_that_would_pad_a_lot(make_engine):
    engine, records = make_engine(prefix_cache=False)  # the q prompts start like the p ones
    outs: queue.Queue = queue.Queue()
    params = SamplingParams(max_new_tokens=2, temperature=0.0)
    # 3 prompts of 33 tokens would fill bucket (4, 64): 256 slots for 99 real tokens
    engine.submit_many([(GenerateWork(f"p{i}", prompt(33, 40 + i), params), outs.put) for i in range(3)])
    collect(outs, 3)
    # 4 prompts of 64 tokens fill (4, 64) exactly: no padding, so the bucket is used
    engine.submit_many([(GenerateWork(f"q{i}", prompt(64, 40 + i), params), outs.put) for i in range(4)])
    collect(outs, 4)
    assert [(r.size, r.bucketed, r.path) for r in records] == [(3, False, "eager"), (4, True, "bucket")]


def test_shorts_get_their_first_token_before_a_long_that_came_first(make_engine):
    engine, records = make_engine()
    outs: queue.Queue = queue.Queue()
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    work = [GenerateWork("long", prompt(900), params)] + [GenerateWork(f"s{i}", prompt(40), params) for i in range(3)]
    engine.submit_many([(w, outs.put) for w in work])
    order = [rid for rid in collect(outs, 4)]
    assert order[-1] == "long"
    assert [r.cls for r in records] == ["short", "long"]


def test_fifo_baseline_serves_in_arrival_order(make_engine):
    engine, records = make_engine(enabled=False, max_batch_size=1)
    outs: queue.Queue = queue.Queue()
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    work = [GenerateWork("long", prompt(900), params)] + [GenerateWork(f"s{i}", prompt(40), params) for i in range(2)]
    engine.submit_many([(w, outs.put) for w in work])
    assert list(collect(outs, 3)) == ["long", "s0", "s1"]


def test_abort_while_decoding_frees_kv_and_says_abort(make_engine):
    engine, _ = make_engine()
    outs: queue.Queue = queue.Queue()
    engine.submit(GenerateWork("a", prompt(30), SamplingParams(max_new_tokens=3000, ignore_eos=True)), outs.put)
    first = outs.get(timeout=30)
    assert not first.finished and engine.kv.used_pages > 0
    engine.abort("a")
    while True:
        out = outs.get(timeout=30)
        if out.finished:
            break
    assert out.finish_reason == "abort"
    deadline = time.monotonic() + 10
    while engine.snapshot.get("live") != 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # poll for the loop's next snapshot
    assert engine.kv.free_pages == engine.kv.num_pages


def test_requests_wait_for_kv_pages_instead_of_failing(make_engine):
    # 12 pages = 192 tokens: room for one request (100 prompt + 60 new) at a time
    engine, _ = make_engine(num_pages=12)
    outs: queue.Queue = queue.Queue()
    params = SamplingParams(max_new_tokens=60, temperature=0.0, ignore_eos=True)
    engine.submit_many([(GenerateWork(f"r{i}", prompt(100, 30 + i), params), outs.put) for i in range(3)])
    got = collect(outs, 3)
    assert all(o[-1].finish_reason == "length" and o[-1].completion_tokens == 60 for o in got.values())
    assert engine.kv.free_pages == 12


@pytest.mark.parametrize("limit", ["context", "pool"])
def test_prompt_and_completion_never_pass_the_context(make_engine, limit):
    """As OpenAI, vLLM and SGLang: a request asking for more than its context leaves stops with
    prompt + completion == the context, the smaller of the context length and the KV pool (64
    tokens here either way). A 63-token prompt got 2 tokens, one more than the context."""
    engine, _ = make_engine(**({"context_len": 64} if limit == "context" else {"num_pages": 4}))
    assert engine.max_prompt_tokens() == 63
    outs: queue.Queue = queue.Queue()
    params = SamplingParams(max_new_tokens=100, temperature=0.0, ignore_eos=True)
    engine.submit_many([(GenerateWork(f"p{n}", prompt(n, 30 + n), params), outs.put) for n in (63, 62, 50)])
    got = collect(outs, 3)
    ends = {rid: (o[-1].finish_reason, o[-1].prompt_tokens + o[-1].completion_tokens) for rid, o in got.items()}
    assert ends == {rid: ("length", 64) for rid in ("p63", "p62", "p50")}
    assert engine.kv.free_pages == engine.kv.num_pages
    engine.kv.self_check()


def test_duplicate_request_id_is_refused_without_harm(make_engine):
    engine, _ = make_engine()
    outs: queue.Queue = queue.Queue()
    slow = SamplingParams(max_new_tokens=200, ignore_eos=True)
    engine.submit(GenerateWork("same", prompt(20), slow), outs.put)
    engine.submit(GenerateWork("same", prompt(20), slow), outs.put)
    got = []
    while len([o for o in got if o.finished]) < 2:
        got.append(outs.get(timeout=30))
    errors = [o for o in got if o.finish_reason == "error"]
    assert len(errors) == 1 and "already in use" in errors[0].error
    assert [o for o in got if o.finished and o.finish_reason == "length"]


def test_a_failing_request_does_not_stop_the_loop(make_engine):
    import torch

    engine, _ = make_engine()
    outs: queue.Queue = queue.Queue()
    broken = GenerateWork("broken", prompt(8), SamplingParams(max_new_tokens=3), kind="decode",
                          kv=torch.zeros(1, 2, 8, 1, 1), first_token=5)  # KV of the wrong shape
    engine.submit(broken, outs.put)
    failed = collect(outs, 1)["broken"][-1]
    assert failed.finish_reason == "error" and "KV import failed" in failed.error
    engine.submit(GenerateWork("fine", prompt(8), SamplingParams(max_new_tokens=3)), outs.put)
    assert collect(outs, 1)["fine"][-1].finish_reason in ("length", "stop")
    assert engine.alive and engine.kv.free_pages == engine.kv.num_pages


def test_random_submits_and_aborts_always_return_every_page(make_engine):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    engine, _ = make_engine(num_pages=40)
    request = st.tuples(st.integers(1, 300), st.integers(1, 40), st.booleans())  # prompt, new, abort?

    @settings(max_examples=12, deadline=None, database=None)
    @given(st.lists(request, min_size=1, max_size=8))
    def scenario(requests):
        outs: queue.Queue = queue.Queue()
        works = [GenerateWork(f"h{id(requests)}-{i}", prompt(n), SamplingParams(max_new_tokens=m, ignore_eos=True))
                 for i, (n, m, _) in enumerate(requests)]
        engine.submit_many([(w, outs.put) for w in works])
        for w, (_, _, abort) in zip(works, requests):
            if abort:
                engine.abort(w.rid)
        got = collect(outs, len(works))
        for w, (_, m, abort) in zip(works, requests):
            last = got[w.rid][-1]
            assert last.finish_reason in (("abort", "length") if abort else ("length",))
            if last.finish_reason == "length":
                assert last.completion_tokens == m
        deadline = time.monotonic() + 10
        while engine.snapshot.get("live") != 0 and time.monotonic() < deadline:
            time.sleep(0.005)  # poll for the loop's next snapshot
        assert engine.kv.free_pages == engine.kv.num_pages

    scenario()
    engine.kv.self_check()


def test_an_empty_prompt_fails_alone(make_engine):
    engine, _ = make_engine()
    outs: queue.Queue = queue.Queue()
    engine.submit_many([(GenerateWork("ok", prompt(8), SamplingParams(max_new_tokens=4)), outs.put),
                        (GenerateWork("empty", [], SamplingParams(max_new_tokens=4)), outs.put)])
    got = collect(outs, 2)
    assert got["empty"][-1].finish_reason == "error"
    assert got["ok"][-1].finish_reason in ("length", "stop")


def test_a_request_that_cannot_be_sampled_fails_alone(make_engine):
    """Sampling parameters that pass validation can still break sampling (a temperature so small
    that the scaled logits overflow float32): that request fails with a 400 naming why; the
    others of its prefill batch, greedy and seeded, complete all their decode steps."""
    engine, records = make_engine()
    outs: queue.Queue = queue.Queue()
    works = [GenerateWork("greedy", prompt(12), SamplingParams(max_new_tokens=6, temperature=0.0)),
             GenerateWork("seeded", prompt(20, 40), SamplingParams(max_new_tokens=6, temperature=0.8, seed=3)),
             GenerateWork("bad", prompt(16, 80), SamplingParams(max_new_tokens=6, temperature=1e-40))]
    engine.submit_many([(w, outs.put) for w in works])
    got = collect(outs, len(works))
    assert len(records) == 1 and records[0].size == 3  # one prefill batch for all three
    bad = got["bad"][-1]
    assert bad.finish_reason == "error" and bad.error_status == 400 and "temperature" in bad.error
    for rid in ("greedy", "seeded"):
        assert not got[rid][-1].error
        assert got[rid][-1].finish_reason == "length" and got[rid][-1].completion_tokens == 6


def test_the_load_report_counts_a_prefill_batch_while_its_forward_pass_runs(make_engine):
    """The batch leaves the queue before its forward pass: /get_load still counts it (a long
    prefill on a CPU takes seconds, and gateways route by this report meanwhile)."""
    import threading

    from laps_agent.engine.core.load_report import load_report
    from tests.support.waiting import poll

    engine, _ = make_engine(wait_window_ms=0)
    release = threading.Event()
    forward = engine.runner.forward

    def held_forward(*args, **kwargs):
        release.wait(30)
        return forward(*args, **kwargs)

    engine.runner.forward = held_forward
    # Nothing prefilled yet: as a prefill engine it could not say what it prefills in time.
    assert "max_pending_tokens" not in load_report("prefill", engine.snapshot, 0, bootstrap_timeout_s=30)
    outs: queue.Queue = queue.Queue()
    engine.submit(GenerateWork("held", prompt(40), SamplingParams(max_new_tokens=2, temperature=0.0)),
                  outs.put)
    try:
        poll(lambda: engine.snapshot.get("prefilling") == (1, 40), message="the batch to be published")
        report = load_report("mixed", engine.snapshot, fetching=0)
        assert (report["waiting_requests"], report["pending_tokens"]) == (1, 40)
    finally:
        release.set()
    assert collect(outs, 1)["held"][-1].completion_tokens == 2
    poll(lambda: load_report("mixed", engine.snapshot, fetching=0)["waiting_requests"] == 0,
         message="the report to drop the finished request")
    # Its prefill was measured: a prefill engine reports what it prefills within half its
    # hand-off timeout (the gateway admits to it by that), a bigger figure for a longer timeout.
    within = [load_report("prefill", engine.snapshot, 0, bootstrap_timeout_s=t)["max_pending_tokens"]
              for t in (30, 300)]
    assert 1 <= within[0] < within[1]


def test_the_load_report_carries_the_batch_budgets_the_gateway_predicts_with(make_engine):
    """A gateway predicts a short's wait behind a long batch from the pod's own budgets: the
    builtin engine reports both, and the gateway's parser reads them back."""
    import json

    from laps_agent.engine.core.load_report import load_report
    from laps_agent.gateway.proxy.engine_load import parse_report

    engine, _ = make_engine(max_prefill_tokens=2048, max_long_batch_tokens=512)
    report = parse_report(json.dumps(load_report("prefill", engine.snapshot, 0)).encode())
    assert (report.batch_tokens, report.long_batch_tokens) == (2048, 512)


def test_a_broken_output_consumer_is_logged_with_the_clients_request_id(make_engine, caplog):
    """The line named the engine's own rid only, which no client or gateway log knows."""
    from tests.support.waiting import poll

    engine, _ = make_engine()

    def broken(out: EngineOutput) -> None:
        raise RuntimeError("the consumer broke")

    engine.submit(GenerateWork("engine-rid-2", prompt(8), SamplingParams(max_new_tokens=1, temperature=0.0),
                               request_id="client-id-9"), broken)
    poll(lambda: any(r.getMessage() == "request client-id-9: output sink failed (engine rid engine-rid-2)"
                     for r in caplog.records), message="the sink failure logged with the request id")


@pytest.mark.parametrize("by_deadline", [True, False])
def test_a_decode_engine_gives_a_freed_slot_to_the_short_prompt_first(tiny_loaded, by_deadline):
    """Decode admission by deadline (policy/scheduling/decode_order.py) in the builtin engine: with
    its one slot busy, a long prompt's KV arrives, then a short one's; when the slot frees, the
    short one (due 0.5 s after it was received) gets its first token before the long one (due
    3 s after). Without a deadline order (--no-laps-scheduler, as stock SGLang) arrival order."""
    import torch

    from laps_agent.engine.model.runner import ModelRunner
    from laps_agent.policy.scheduling.decode_order import DecodeOrder

    runner = ModelRunner(tiny_loaded, num_pages=512, page_size=16)
    order = DecodeOrder.from_slo({"short": 0.5, "long": 3.0}, length_threshold=64) if by_deadline else None
    engine = Engine(runner, tiny_loaded.tokenizer,
                    EngineConfig(role="decode", max_running_requests=1, context_len=4096, decode_order=order))
    engine.start()
    try:
        cfg = runner.config

        def decode(rid: str, tokens: int, new: int, received: float) -> GenerateWork:
            kv = torch.zeros((cfg.num_layers, 2, tokens, cfg.num_kv_heads, cfg.head_dim), dtype=runner.k_pool.dtype)
            return GenerateWork(rid, prompt(tokens), SamplingParams(max_new_tokens=new, ignore_eos=True),
                                kind="decode", kv=kv, first_token=5, received=received)

        outs: queue.Queue = queue.Queue()
        engine.submit(decode("busy", 16, 3000, time.monotonic()), outs.put)
        assert outs.get(timeout=30).rid == "busy"   # its first token: it holds the one slot
        now = time.monotonic()
        engine.submit_many([(decode("long", 200, 2, now), outs.put), (decode("short", 20, 2, now + 0.001), outs.put)])
        engine.abort("busy")   # after both are queued (one inbox, in order): the slot frees now
        firsts = []
        for out in iter(lambda: outs.get(timeout=30), None):
            if out.rid == "busy" and out.finished:
                assert out.finish_reason == "abort"
            elif out.rid != "busy" and out.rid not in firsts:
                firsts.append(out.rid)
            if len(firsts) == 2:
                break
        assert firsts == (["short", "long"] if by_deadline else ["long", "short"])
    finally:
        engine.stop()
