"""Benchmark (prints, asserts nothing): SmolLM2 load time, 1x256 prefill, and 8 short prompts as
one bucket batch vs packed eager batch vs one by one.

    .venv/bin/python -m tests.unit.engine_model.bench_model [--repeats 5] [--model PATH]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads libgomp; see fixtures_models

import torch  # noqa: E402

from laps_agent.engine.model.loader import default_model_path, load_model  # noqa: E402
from laps_agent.engine.model.runner import ForwardItem, ModelRunner  # noqa: E402
from laps_agent.policy.scheduling.buckets import BucketGrid  # noqa: E402

PAGE = 16


def _pages(first: int, tokens: int) -> list[int]:
    return list(range(first, first + -(-tokens // PAGE)))


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.model or default_model_path()
    start = time.perf_counter()
    loaded = load_model(path)
    print(f"model {loaded.name}: load {time.perf_counter() - start:.2f} s, torch threads {torch.get_num_threads()}")

    vocab = loaded.config.vocab_size
    rng = random.Random(0)
    grid = BucketGrid([1, 2, 4, 8], [16, 32, 64, 128, 256])
    runner = ModelRunner(loaded, num_pages=512, page_size=PAGE, grid=grid)

    long_ids = [rng.randrange(100, vocab) for _ in range(256)]
    ms = _median_ms(lambda: runner.forward([ForwardItem(long_ids, 0, _pages(0, 256))]), args.repeats)
    print(f"prefill 1x256 eager: {ms:.1f} ms")
    ms = _median_ms(lambda: runner.forward([ForwardItem(long_ids, 0, _pages(0, 256))], bucketed=True), args.repeats)
    print(f"prefill 1x256 bucket (1,256): {ms:.1f} ms")

    for lengths in ([32] * 8, [rng.randrange(12, 60) for _ in range(8)]):
        prompts = [[rng.randrange(100, vocab) for _ in range(n)] for n in lengths]
        items = [ForwardItem(ids, 0, _pages(8 * i, len(ids))) for i, ids in enumerate(prompts)]
        bucket = grid.choose(lengths)
        one = _median_ms(lambda items=items: [runner.forward([it]) for it in items], args.repeats)
        packed = _median_ms(lambda items=items: runner.forward(items), args.repeats)
        padded = _median_ms(lambda items=items: runner.forward(items, bucketed=True), args.repeats)
        print(f"8 prompts lengths={lengths} ({sum(lengths)} tokens, bucket {bucket.batch_size}x{bucket.seq_len}):"
              f" one-by-one {one:.1f} ms, packed eager batch {packed:.1f} ms, bucket batch {padded:.1f} ms"
              f" (bucket speed-up vs one-by-one x{one / padded:.2f})")

    decode = [ForwardItem([5], 40, _pages(8 * i, 41)) for i in range(8)]
    ms = _median_ms(lambda: runner.forward(decode), args.repeats)
    print(f"decode step, batch 8 at 40 tokens: {ms:.1f} ms")


if __name__ == "__main__":
    main()
