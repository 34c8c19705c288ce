"""`laps bench profile`: measure the builtin engine on this machine, fit an emulation profile,
and print how far a profile's cost model is from the measurements.

What is measured (the builtin engine's own `ModelRunner`, in-process, medians of --repeats):
  prefill   packed eager batches of n requests x L tokens (n in 1..8, L in 16..2048, up to
            --max-batch-tokens per batch): the profile's eager formula
            overhead + per_request*n + per_token*n*L + attention*n*L^2;
  decode    one step of n running requests with C tokens of context each (n in 1..32, C in
            64..2048): overhead + per_request*n + per_context_token*n*C;
  transfer  one PD hand-off of T tokens as the builtin engine does it: KV export from the pool,
            serialisation, deserialisation (loopback bandwidth is not the bottleneck here):
            latency + T*kv_bytes_per_token/bytes_per_s.
Each fit is a non-negative least squares on relative error (every sample weighs the same
whatever its size). Printed: every sample with its measured and fitted time, the mean and max
relative error of the fit and of the profile given with --against (default: the shipped
cpu-smollm2), and with --write FILE a profile YAML of the fit.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import yaml

from laps_agent.emulated.profile import ProfileError, load_profile, parse_profile, relative_error
from laps_agent.modelio.model_files import ModelLoadError
from laps_agent.serving.flag_types import at_least, output_file, positive

_PREFILL_LENGTHS = (16, 32, 64, 128, 256, 512, 1024, 2048)
_PREFILL_BATCHES = (1, 2, 4, 8)
_DECODE_BATCHES = (1, 4, 8, 16, 32)
_DECODE_CONTEXTS = (64, 512, 2048)
_TRANSFER_LENGTHS = (64, 256, 1024, 2048)


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first calls of a shape pay allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _nnls(rows: list[list[float]], measured: list[float]) -> list[float]:
    """Non-negative least squares on relative error: minimise sum((x.row - m)/m)^2, x >= 0,
    by dropping the most negative coefficient until none is left (few unknowns, so exact)."""
    import numpy as np

    a = np.array(rows, dtype=float) / np.array(measured)[:, None]
    b = np.ones(len(measured))
    active = list(range(a.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            out = [0.0] * a.shape[1]
            for i, c in zip(active, coef):
                out[i] = max(float(c), 0.0)
            return out
        active.pop(int(np.argmin(coef)))


def measure(args: argparse.Namespace) -> dict[str, list]:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `laps engine`; before torch loads
    # lazy: torch loads after OMP_WAIT_POLICY is set, and only when this benchmark runs
    import torch

    from laps_agent.engine.model.loader import default_model_path, load_model
    from laps_agent.engine.model.runner import ForwardItem, ModelRunner
    from laps_agent.engine.pd.kv_codec import KVTransfer

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    loaded = load_model(args.model or default_model_path())
    page = 16
    pages = -(-max(args.max_batch_tokens, 32 * max(_DECODE_CONTEXTS) + 32 * page) // page) + 64
    runner = ModelRunner(loaded, num_pages=pages, page_size=page)
    cfg = loaded.config
    print(f"model {loaded.name}: {cfg.num_layers} layers, {torch.get_num_threads()} torch threads, "
          f"{platform.processor() or platform.machine()}")

    vocab = cfg.vocab_size

    def items(n: int, length: int, start: int = 0) -> list:
        per = -(-(start + length) // page)
        return [ForwardItem([(7 + 31 * (i + j)) % vocab for j in range(length)], start,
                            list(range(i * per, (i + 1) * per))) for i in range(n)]

    data: dict[str, list] = {"prefill": [], "decode": [], "transfer": []}
    for n in _PREFILL_BATCHES:
        for length in _PREFILL_LENGTHS:
            if n * length > args.max_batch_tokens:
                continue
            batch = items(n, length)
            s = _median_seconds(lambda batch=batch: runner.forward(batch, bucketed=False), args.repeats)
            data["prefill"].append((n, length, s))
            print(f"  prefill {n} x {length:5d} tokens  {s * 1e3:8.1f} ms", flush=True)
    for n in _DECODE_BATCHES:
        for context in _DECODE_CONTEXTS:
            step = items(n, 1, start=context)
            s = _median_seconds(lambda step=step: runner.forward(step, bucketed=False), args.repeats)
            data["decode"].append((n, context, s))
            print(f"  decode  {n:2d} running x {context:5d} context  {s * 1e3:8.1f} ms", flush=True)
    for length in _TRANSFER_LENGTHS:
        pages_of = list(range(-(-length // page)))

        def hand_off(pages_of: list[int] = pages_of, length: int = length) -> None:
            kv = runner.export_kv(pages_of, length)
            KVTransfer.decode(KVTransfer(1, list(range(length)), 0, kv).encode())

        s = _median_seconds(hand_off, args.repeats)
        data["transfer"].append((length, s))
        print(f"  hand-off {length:5d} tokens  {s * 1e3:8.1f} ms", flush=True)
    data["kv_bytes_per_token"] = [cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4]
    data["meta"] = [{"model": loaded.name, "threads": torch.get_num_threads(),
                     "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                     "date": datetime.date.today().isoformat()}]
    return data


def fit(data: dict[str, list]) -> dict:
    pre = data["prefill"]
    p = _nnls([[1.0, n, n * length, n * length * length] for n, length, _ in pre], [s for *_, s in pre])
    dec = data["decode"]
    d = _nnls([[1.0, n, n * context] for n, context, _ in dec], [s for *_, s in dec])
    tr = data["transfer"]
    t = _nnls([[1.0, length] for length, _ in tr], [s for _, s in tr])
    bpt = data["kv_bytes_per_token"][0]
    return {"prefill": {"overhead_s": p[0], "per_request_s": p[1], "per_token_s": p[2], "attention_s": p[3]},
            "decode": {"overhead_s": d[0], "per_request_s": d[1], "per_context_token_s": d[2]},
            "transfer": {"latency_s": t[0], "bytes_per_s": bpt / t[1] if t[1] > 0 else 1e12}}


def errors(profile, data: dict[str, list]) -> dict[str, list[float]]:
    """Relative error of `profile` on every measured sample, per kind."""

    return {
        "prefill": [relative_error(profile.prefill_seconds([length] * n), s) for n, length, s in data["prefill"]],
        "decode": [relative_error(profile.decode_seconds(n, n * context), s) for n, context, s in data["decode"]],
        "transfer": [relative_error(profile.transfer_seconds(length), s) for length, s in data["transfer"]],
    }


def _report(name: str, errs: dict[str, list[float]]) -> None:
    parts = [f"{kind} mean {statistics.fmean(e):6.1%} max {max(e):6.1%}" for kind, e in errs.items() if e]
    print(f"{name:34s} " + " | ".join(parts))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="laps bench profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF or HF dir (default: SmolLM2-135M)")
    # Checked before minutes of measurement, as --against and --write are: they used to fail
    # after it, in a traceback, and the measurements were lost.
    p.add_argument("--repeats", type=positive(int), default=3)
    p.add_argument("--max-batch-tokens", type=at_least(int, _PREFILL_LENGTHS[0]), default=4096,
                   help=f"largest prefill batch measured (>= {_PREFILL_LENGTHS[0]}, the shortest prompt)")
    p.add_argument("--torch-threads", type=positive(int), default=None)
    p.add_argument("--against", default="cpu-smollm2", help="profile to check (name or YAML file)")
    p.add_argument("--write", type=output_file, help="write the fitted profile YAML here")
    p.add_argument("--name", default="cpu-smollm2", help="name of the written profile")
    args = p.parse_args(argv)


    try:
        against = load_profile(args.against)
        data = measure(args)
    except (ProfileError, ModelLoadError) as exc:
        print(f"laps bench profile: error: {exc}", file=sys.stderr)
        return 2
    fitted = fit(data)
    meta = data["meta"][0]
    doc = against.model_dump(exclude_none=True)
    doc.update({kind: dict(coef) for kind, coef in fitted.items()})  # CPU: no CUDA graphs
    doc.pop("fit", None)
    doc["model"]["kv_bytes_per_token"] = data["kv_bytes_per_token"][0]
    doc.update(name=args.name, provenance="fitted from measurements", source=(
        f"`laps bench profile` on {meta['date']}: the builtin engine alone, {meta['model']} fp32, "
        f"{meta['threads']} torch threads, {meta['cores']} cores ({meta['cpu']}). Non-negative least "
        f"squares on relative error over {len(data['prefill'])} prefill batches (1-8 requests x "
        f"16-2048 tokens), {len(data['decode'])} decode steps (1-32 running x 64-2048 context) and "
        f"{len(data['transfer'])} KV hand-offs (export + serialise + deserialise)."))
    new = parse_profile(doc)
    new_errors = errors(new, data)
    doc["fit"] = {kind: {"samples": len(e), "mean_rel_error": round(statistics.fmean(e), 4),
                         "max_rel_error": round(max(e), 4)} for kind, e in new_errors.items()}
    print("\nfit error (relative, over the samples above):")
    _report(f"profile {against.name} (as shipped)", errors(against, data))
    _report("fit of these measurements", new_errors)
    print("\nfitted coefficients:\n" + yaml.safe_dump(fitted, sort_keys=False))
    if args.write:
        args.write.write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
        print(f"wrote {args.write}")
    return 0
