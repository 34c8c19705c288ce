"""Where the builtin engine's eager forward spends its time on a GPU: `python -m
scripts.profile_engine MODEL_DIR [--device cuda] [--dtype bfloat16]`.

Times the runner's eager path (one short prompt, one long prompt, the two packed together as
FIFO batches them, a decode step of 8) and prints torch.profiler's top operators for each. A
measurement aid for the `device` tool's machines, not part of the product."""
from __future__ import annotations

import argparse
import random
import time

import torch
from torch.nn import functional as F

from laps_agent.engine.model.loader import load_model, resolve_dtype
from laps_agent.engine.model.runner import ForwardItem, ModelRunner

PAGE = 16


def _items(prompts: list[list[int]], first_page: int = 0) -> list[ForwardItem]:
    out, page = [], first_page
    for ids in prompts:
        n = -(-(len(ids) + 1) // PAGE)
        out.append(ForwardItem(list(ids), 0, list(range(page, page + n))))
        page += n
    return out


def _timed(fn, repeats: int, sync) -> float:
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - t0) / repeats


def _sdpa_backends(device: str, dtype: torch.dtype) -> None:
    """Which SDPA kernels accept our two call shapes (GQA via enable_gqa; causal or a bool mask)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 9, 512, 64, device=device, dtype=dtype)
    kv = torch.randn(1, 3, 512, 64, device=device, dtype=dtype)
    mask = torch.ones(1, 1, 512, 512, dtype=torch.bool, device=device).tril()
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        for name, kwargs in (("is_causal", dict(is_causal=True)), ("bool mask", dict(attn_mask=mask))):
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True, **kwargs)
                verdict = "ok"
            except RuntimeError as err:
                verdict = "refused: " + str(err).splitlines()[0][:100]
            print(f"  sdpa {backend.name:20s} gqa + {name:9s}: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    dtype = resolve_dtype(args.dtype, args.device)
    loaded = load_model(args.model, device=args.device, dtype=dtype)
    runner = ModelRunner(loaded, num_pages=2048, page_size=PAGE, cuda_graphs=False)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    rng = random.Random(0)
    vocab = loaded.config.vocab_size

    def prompt(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    short, long_ = prompt(64), prompt(2048)
    shorts = [prompt(rng.randint(32, 100)) for _ in range(8)]
    cases = {
        "eager 1 x 64 tokens": lambda: runner.forward(_items([short])),
        "eager 1 x 2048 tokens": lambda: runner.forward(_items([long_])),
        "eager packed 2048 + 8 short": lambda: runner.forward(_items([long_] + shorts)),
        "eager decode step, 8 x 1 token at ~80": lambda: runner.forward_decode(
            [ForwardItem([5], len(s), it.pages) for s, it in zip(shorts, _items(shorts))]),
    }
    print(f"{loaded.name} on {args.device} in {dtype}, torch {torch.__version__}")
    if args.device == "cuda":
        _sdpa_backends(args.device, dtype)
    for name, fn in cases.items():
        print(f"{name:40s} {1000 * _timed(fn, 5, sync):8.2f} ms")
    # Serving sees a new prompt length nearly every request, and a new context width nearly
    # every eager decode step: a kernel library that plans per shape (cuDNN's attention) pays
    # that planning again and again. The engine's eager paths leave it out; "cuDNN allowed" puts it
    # back (at the head of the list, as torch 2.11 ranks it on Hopper) to show what that saves.
    lengths = iter(range(300, 100000, 7))
    prefix = prompt(2048)
    runner.forward(_items([prefix]))
    prefix_pages = _items([prefix + [0] * 600])[0].pages

    def new_suffix():
        suffix = prompt(next(lengths) - 200)
        return runner.forward([ForwardItem(suffix, len(prefix), prefix_pages)])

    contexts = iter(range(100, 100000, 16))

    def new_width():
        c = next(contexts) % 3000 + 100
        return runner.forward_decode([ForwardItem([5], c + j, list(range(300 + 200 * j, 500 + 200 * j)))
                                      for j in range(8)])

    varying = {
        "1 x ~300 tokens, a new length each": lambda: runner.forward(_items([prompt(next(lengths))])),
        "~100-400 tokens after a cached 2048, new each": new_suffix,
        "decode step of 8, a new context width each": new_width,
    }
    for name, fn in varying.items():
        print(f"{'eager ' + name:52s} {1000 * _timed(fn, 10, sync):8.2f} ms")
    if args.device == "cuda":
        from torch.nn.attention import SDPBackend

        from laps_agent.engine.model.attention import EAGER_SDPA_BACKENDS

        EAGER_SDPA_BACKENDS.insert(0, SDPBackend.CUDNN_ATTENTION)  # the list the runner uses
        for name, fn in varying.items():
            print(f"{'  ' + name + ', cuDNN allowed':52s} {1000 * _timed(fn, 10, sync):8.2f} ms")
        EAGER_SDPA_BACKENDS.pop(0)
        cases.update({k: v for k, v in varying.items() if k != "1 x ~300 tokens, a new length each"})
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for name, fn in cases.items():
        with torch.profiler.profile(activities=activities) as prof:
            fn()
            sync()
        print(f"\n=== {name}")
        key = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
