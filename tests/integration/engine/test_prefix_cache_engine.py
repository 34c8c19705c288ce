"""The prefix cache in the engine loop (in-process, tiny model, real runner): later prompts that
start like earlier ones prefill only their new tokens, with the same answers as without the cache."""
from __future__ import annotations

import queue

import pytest
import torch

from laps_agent.engine.core.requests import GenerateWork
from laps_agent.engine.engine import Engine, EngineConfig
from laps_agent.engine.model.runner import ModelRunner
from laps_agent.engine.model.sampling import SamplingParams
from tests.integration.engine.helpers import wait_for
from tests.integration.engine.test_engine_loop import collect, prompt

PAGE = 16
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)


class RecordingRunner(ModelRunner):
    """The real runner, keeping what each prefill computed: (start_pos, tokens) per item, logits."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.prefills: list[tuple[list[tuple[int, int]], torch.Tensor]] = []

    def forward(self, items, *, bucketed: bool = False):
        logits, stats = super().forward(items, bucketed=bucketed)
        self.prefills.append(([(it.start_pos, len(it.token_ids)) for it in items], logits.clone()))
        return logits, stats


@pytest.fixture
def make_engine(tiny_loaded):  # tiny_loaded: tests/support/fixtures_models.py
    started: list[Engine] = []

    def make(prefix_cache: bool, num_pages: int = 256) -> tuple[Engine, RecordingRunner, list]:
        runner = RecordingRunner(tiny_loaded, num_pages=num_pages, page_size=PAGE)
        records: list = []
        engine = Engine(runner, tiny_loaded.tokenizer,
                        EngineConfig(context_len=4096, prefix_cache=prefix_cache),
                        on_prefill=records.append)
        engine.start()
        started.append(engine)
        return engine, runner, records

    yield make
    for engine in started:
        engine.stop()


def run(engine: Engine, rid: str, ids: list[int], params: SamplingParams = GREEDY) -> list:
    outs: queue.Queue = queue.Queue()
    engine.submit(GenerateWork(rid, ids, params), outs.put)
    return collect(outs, 1)[rid]


def tokens(outs: list) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def test_shared_prefix_computes_only_the_new_tokens_with_the_same_logits_and_answer(make_engine):
    cached, cached_runner, records = make_engine(prefix_cache=True)
    plain, plain_runner, _ = make_engine(prefix_cache=False)
    first = prompt(40)
    second = first + prompt(23, start=200)              # shares 2 full pages (32 tokens)
    for engine in (cached, plain):
        run(engine, "first", first)
    got, want = run(cached, "second", second), run(plain, "second", second)

    (items, logits), (plain_items, plain_logits) = cached_runner.prefills[-1], plain_runner.prefills[-1]
    assert items == [(32, len(second) - 32)] and plain_items == [(0, len(second))]
    assert torch.allclose(logits, plain_logits, atol=1e-4)   # fp32: only summation order differs
    assert tokens(got) == tokens(want)
    assert got[-1].cached_tokens == 32 and want[-1].cached_tokens == 0
    assert (records[-1].real_tokens, records[-1].requests[0].cached_tokens) == (len(second) - 32, 32)
    cached.kv.self_check()
    assert cached.kv.free_pages == cached.kv.num_pages and cached.kv.cached_pages > 0


def test_next_turn_reuses_the_previous_answer_too(make_engine):
    cached, runner, _ = make_engine(prefix_cache=True)
    plain, _, _ = make_engine(prefix_cache=False)
    turn1 = prompt(30)
    answer = tokens(run(cached, "t1", turn1, SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)))
    # prompt + answer but its last token have KV: 39 tokens, 2 full pages, 2 of them answer tokens
    turn2 = turn1 + answer + prompt(12, start=150)
    got = run(cached, "t2", turn2)
    assert got[-1].cached_tokens == 32 and runner.prefills[-1][0] == [(32, len(turn2) - 32)]
    assert tokens(got) == tokens(run(plain, "t2", turn2))


def test_a_fully_cached_prompt_still_prefills_its_last_page(make_engine):
    cached, runner, _ = make_engine(prefix_cache=True)
    plain, _, _ = make_engine(prefix_cache=False)
    ids = prompt(48)                                     # exactly 3 pages
    run(cached, "a", ids)
    again = run(cached, "b", ids)
    assert runner.prefills[-1][0] == [(32, 16)]          # the last token's page is computed
    assert tokens(again) == tokens(run(plain, "b", ids))


def test_scheduler_classifies_by_the_tokens_left_to_prefill(make_engine):
    engine, _, records = make_engine(prefix_cache=True)
    long_prompt = prompt(600)
    run(engine, "long", long_prompt, SamplingParams(max_new_tokens=1, temperature=0.0))
    run(engine, "turn2", long_prompt + prompt(40, start=250), SamplingParams(max_new_tokens=1, temperature=0.0))
    # 37 full pages of the 600-token prompt are cached: 48 of 640 tokens left, a short prefill
    assert [r.cls for r in records] == ["long", "short"]
    assert records[-1].requests[0].cached_tokens == 592 and records[-1].real_tokens == 48
    engine.kv.self_check()


def test_eviction_under_a_small_pool_keeps_answers_right(make_engine):
    # 10 pages = 160 tokens; each request reserves 4-5 pages, so cached prefixes must make way.
    small, _, records = make_engine(prefix_cache=True, num_pages=10)
    plain, _, _ = make_engine(prefix_cache=False)
    bases = [prompt(40, start=20 + 50 * b) for b in range(3)]
    work = [(f"r{i}", bases[i % 3] + prompt(10 + i, start=100 + 7 * i)) for i in range(9)]
    outs: queue.Queue = queue.Queue()
    for i in range(0, 9, 3):  # three waves of three at once: they also wait for pages
        small.submit_many([(GenerateWork(rid, ids, GREEDY), outs.put) for rid, ids in work[i:i + 3]])
        got = collect(outs, 3)
        for rid, ids in work[i:i + 3]:
            assert got[rid][-1].finish_reason == "length", got[rid][-1].error
            assert tokens(got[rid]) == tokens(run(plain, rid, ids)), rid
    assert sum(r.evicted_pages for r in records) > 0
    assert sum(req.cached_tokens for r in records for req in r.requests) > 0
    small.kv.self_check()
    assert small.kv.free_pages == small.kv.num_pages


def test_a_warm_waits_for_real_work_then_fills_the_cache_in_chunks(make_engine):
    engine, runner, records = make_engine(prefix_cache=True)
    plain, _, _ = make_engine(prefix_cache=False)
    conversation = prompt(300, start=10)                 # a finished turn: prompt + answer
    other = prompt(40, start=120)
    outs: queue.Queue = queue.Queue()
    warms: list = []
    engine.warms.report = lambda outcome, n: warms.append((outcome, n))
    # Both arrive together: the real request is served first, prefill and decode, and only
    # then the warm, in chunks of at most the length threshold (256) of whole pages (288 of 300).
    engine.submit_many([(GenerateWork("warm", conversation, None, kind="warm"), outs.put),
                        (GenerateWork("real", other, GREEDY), outs.put)])
    assert tokens(collect(outs, 1)["real"]) == tokens(run(plain, "real", other))
    wait_for(lambda: ("done", 0) in warms, message="the warm to finish")
    assert [items for items, _ in runner.prefills] == [[(0, 40)], [(0, 256)], [(256, 32)]]
    assert warms == [("chunk", 256), ("chunk", 32), ("done", 0)]
    assert len(records) == 1                             # warms are not prefill batches of requests
    # The chat's next turn finds all of it cached and computes only its new message.
    turn2 = conversation + prompt(20, start=200)
    got = run(engine, "turn2", turn2)
    assert got[-1].cached_tokens == 288 and runner.prefills[-1][0] == [(288, len(turn2) - 288)]
    assert tokens(got) == tokens(run(plain, "turn2", turn2))
    engine.kv.self_check()


def test_a_warm_without_a_prefix_cache_is_refused_and_computes_nothing(make_engine):
    engine, runner, _ = make_engine(prefix_cache=False)
    warms: list = []
    engine.warms.report = lambda outcome, n: warms.append((outcome, n))
    engine.submit(GenerateWork("warm", prompt(64), None, kind="warm"), lambda out: None)
    wait_for(lambda: warms == [("refused", 0)], message="the warm to be refused")
    assert runner.prefills == []
