"""`laps bench engine`: FIFO vs LAPS prefill scheduling on this machine, in-process (no HTTP).

Scenario: one long prompt arrives together with several short ones. Each request generates one
token, so its latency is its time to first token (TTFT). Prints short/long TTFT under both
schedulers, the throughput of one batched short prefill vs the same prompts one by one, and the
padding the bucketed path computed."""
from __future__ import annotations

import argparse
import logging
import os
import queue
import random
import statistics
import sys
import time
from dataclasses import dataclass

from laps_agent.engine.core.config import DTYPE_CHOICES
from laps_agent.engine.core.requests import EngineOutput, GenerateWork
from laps_agent.engine.model.sampling import SamplingParams
from laps_agent.modelio.model_files import ModelLoadError
from laps_agent.policy.classes import CLASSES, DEFAULT_LENGTH_THRESHOLD
from laps_agent.policy.scheduling.buckets import BucketGrid
from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_agent.serving.flag_types import non_negative, positive


@dataclass
class RunResult:
    short_ttft: list[float]
    long_ttft: list[float]
    padded: int
    real: int


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="laps bench engine", description=__doc__)
    p.add_argument("--model", default=None, help="GGUF or HF dir (default: SmolLM2-135M)")
    # Checked as parsed, before the model loads: they used to fail after it, in a traceback.
    p.add_argument("--long-tokens", type=positive(int), default=2048)
    p.add_argument("--short-count", type=positive(int), default=8)
    p.add_argument("--short-min", type=positive(int), default=32)
    p.add_argument("--short-max", type=positive(int), default=100)
    p.add_argument("--length-threshold", type=non_negative(int), default=DEFAULT_LENGTH_THRESHOLD)
    p.add_argument("--repeats", type=positive(int), default=3)
    p.add_argument("--torch-threads", type=positive(int), default=None)
    p.add_argument("--seed", type=non_negative(int), default=0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="as `laps engine --dtype` (auto: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--max-batch", type=positive(int), default=8, help="requests per prefill batch (both schedulers)")
    p.add_argument("--part", choices=("all", "ttft", "throughput"), default="all")
    args = p.parse_args(argv)
    if args.short_min > args.short_max:
        p.error(f"--short-min ({args.short_min}) must be <= --short-max ({args.short_max})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level="WARNING")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `laps engine` does; before torch
    # lazy: torch loads after OMP_WAIT_POLICY is set, and only when this benchmark runs
    import torch

    from laps_agent.engine.engine import Engine, EngineConfig
    from laps_agent.engine.model.loader import default_model_path, load_model, resolve_dtype
    from laps_agent.engine.model.runner import ForwardItem, ModelRunner

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print(f"laps bench engine: error: --device cuda, but torch {torch.__version__} sees no CUDA device",
              file=sys.stderr)
        return 2
    path = args.model or str(default_model_path())
    t0 = time.monotonic()
    dtype = resolve_dtype(args.dtype, device)  # auto: bf16 on CUDA (the flash-attn path), fp32 on CPU
    try:
        loaded = load_model(path, device=device, dtype=dtype)
    except ModelLoadError as err:
        print(f"laps bench engine: error: {err}", file=sys.stderr)
        return 2  # as laps engine and argparse say a bad argument
    print(f"model {loaded.name} on {device} in {str(dtype).removeprefix('torch.')} "
          f"({torch.get_num_threads()} threads), loaded in {time.monotonic() - t0:.1f}s")
    context = loaded.config.max_position_embeddings
    if max(args.long_tokens, args.short_max) >= context:  # +1 generated token; the engine refuses
        # it in its thread, which this benchmark met as a traceback and an abort
        print(f"laps bench engine: error: --long-tokens/--short-max must be < the model's context "
              f"({context} tokens)", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    vocab = loaded.config.vocab_size
    low = min(100, vocab // 4)  # skip the special tokens at the start of most vocabularies
    long_ids = [rng.randrange(low, vocab) for _ in range(args.long_tokens)]
    shorts = [[rng.randrange(low, vocab) for _ in range(rng.randint(args.short_min, args.short_max))]
              for _ in range(args.short_count)]
    warm_prompts = [[rng.randrange(low, vocab) for _ in range(n)] for n in (24, 160, 48, 96)]
    grid = BucketGrid([1, 2, 4, 8, 16], [16, 32, 64, 128, 256])
    page = 16
    pages = -(-(args.long_tokens + sum(map(len, shorts)) + 64 * (args.short_count + 1)) // page) + 8
    runner = ModelRunner(loaded, num_pages=pages, page_size=page, grid=grid, cuda_graphs=(device == "cuda"))
    if runner.graphs is not None:  # as the engine does at start-up: no capture inside a timed run
        t0 = time.monotonic()
        print(f"captured {len(runner.capture_graphs())} CUDA graphs in {time.monotonic() - t0:.1f}s")
    print(f"long prompt {args.long_tokens} tokens + {len(shorts)} short prompts of "
          f"{sorted(map(len, shorts))} tokens, arriving together; {args.repeats} repeats")

    def items(prompts):
        out, next_page = [], 0
        for ids in prompts:
            n = -(-len(ids) // page)
            out.append(ForwardItem(list(ids), 0, list(range(next_page, next_page + n))))
            next_page += n
        return out

    def run(enabled: bool, bucketed: str = "auto", adaptive: bool = False) -> RunResult:
        cfg = SchedulerConfig(enabled=enabled, length_threshold=args.length_threshold,
                              max_batch_size=args.max_batch, wait_max_batch=args.max_batch,
                              adaptive_window=adaptive)
        records = []
        engine = Engine(runner, loaded.tokenizer,
                        EngineConfig(role="mixed", scheduler=cfg, batch_prefill_graphs_mode=bucketed,
                                     context_len=loaded.config.max_position_embeddings),
                        grid=grid, on_prefill=records.append)
        engine.start()
        outs: queue.Queue[EngineOutput] = queue.Queue()
        params = SamplingParams(max_new_tokens=1, temperature=0.0)
        if adaptive:
            # A serving engine has history: a few earlier requests of different lengths, one at
            # a time, give the scheduler's cost model its estimate before the burst arrives.
            for i, ids in enumerate(warm_prompts):
                engine.submit_many([(GenerateWork(f"warm{i}", ids, params), outs.put)])
                while not outs.get(timeout=600).finished:
                    pass
            records.clear()
        works = [GenerateWork("long", long_ids, params)] + [GenerateWork(f"s{i}", ids, params)
                                                             for i, ids in enumerate(shorts)]
        now = time.monotonic()
        for w in works:
            w.arrival = now
        engine.submit_many([(w, outs.put) for w in works])
        ttft = {}
        while len(ttft) < len(works):
            out = outs.get(timeout=600)
            if out.error:
                raise RuntimeError(out.error)
            if out.ttft_s is not None:
                ttft[out.rid] = out.ttft_s
        engine.stop()
        return RunResult([v for k, v in ttft.items() if k != "long"], [ttft["long"]],
                         sum(r.padded_tokens for r in records if r.bucketed),
                         sum(r.real_tokens for r in records if r.bucketed))

    # warm-up: first calls of each shape pay one-off allocation costs
    runner.forward(items(shorts), bucketed=True)
    runner.forward(items(shorts), bucketed=False)
    runner.forward(items(shorts[:1]), bucketed=False)

    if args.part in ("all", "ttft"):
        ttft_report(args, run)
    if args.part in ("all", "throughput"):
        throughput_report(args, runner, shorts, items)
    return 0


def ttft_report(args: argparse.Namespace, run) -> None:
    # FIFO; LAPS as the engine runs it here (auto: packed short batches without CUDA graphs);
    # LAPS with every short batch forced through its padded bucket.
    # LAPS-adaptive: the adaptive mode, whose cost model also sizes the short batches.
    variants = {"FIFO": (False, "auto", False), "LAPS": (True, "auto", False),
                "LAPS-adaptive": (True, "auto", True), "LAPS-bucketed": (True, "always", False)}
    results: dict[str, list[RunResult]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved, so background load hits all variants alike
        for name, (enabled, bucketed, adaptive) in variants.items():
            results[name].append(run(enabled, bucketed, adaptive))

    def agg(name: str, attr: str) -> list[float]:
        return [x for r in results[name] for x in getattr(r, attr)]

    print("\nTTFT (seconds)                 mean     p50     max")
    for cls in CLASSES:
        for name in variants:
            xs = agg(name, f"{cls}_ttft")
            print(f"  {cls:<6} {name:<18} {statistics.mean(xs):7.3f} {statistics.median(xs):7.3f} {max(xs):7.3f}")
    fs, fl = agg("FIFO", "short_ttft"), agg("FIFO", "long_ttft")
    for name in ("LAPS", "LAPS-adaptive", "LAPS-bucketed"):
        ls_, ll = agg(name, "short_ttft"), agg(name, "long_ttft")
        print(f"  {name}: short/FIFO mean {statistics.mean(ls_) / statistics.mean(fs):.3f}x, "
              f"p50 {statistics.median(ls_) / statistics.median(fs):.3f}x (target <= 0.2x); "
              f"long/FIFO {statistics.mean(ll) / statistics.mean(fl):.3f}x (target <= 1.3x)")
    padded = sum(r.padded for r in results["LAPS-bucketed"])
    real = sum(r.real for r in results["LAPS-bucketed"])
    if padded:
        print(f"  padding waste (LAPS-bucketed short batches): {padded - real} of {padded} tokens "
              f"= {(padded - real) / padded:.1%}")


def throughput_report(args: argparse.Namespace, runner, shorts: list[list[int]], items) -> None:
    """Batched short prefill vs the same prompts one by one."""
    batch_items = items(shorts)
    tokens = sum(map(len, shorts))
    ways = {"single": lambda: [runner.forward([it], bucketed=False) for it in items(shorts)],
            "bucketed": lambda: runner.forward(batch_items, bucketed=True),
            "packed": lambda: runner.forward(batch_items, bucketed=False)}
    # CUDA runs kernels (a graph replay above all) after forward returns: time to the device's end.
    import torch
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(max(args.repeats, 3)):  # interleaved, so background load hits all alike
        for name, fn in ways.items():
            sync()
            start = time.monotonic()
            fn()
            sync()
            times[name].append(time.monotonic() - start)
    single, batched, packed = (statistics.median(times[n]) for n in ("single", "bucketed", "packed"))
    print(f"\nshort prefill throughput ({len(shorts)} prompts, {tokens} tokens):")
    print(f"  one by one (eager)     {tokens / single:9.0f} tok/s")
    print(f"  batched, bucketed      {tokens / batched:9.0f} tok/s   {single / batched:.2f}x one-by-one (target >= 1.5x)")
    print(f"  batched, packed eager  {tokens / packed:9.0f} tok/s   {single / packed:.2f}x one-by-one")
