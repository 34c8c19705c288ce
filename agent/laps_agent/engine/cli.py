"""`laps engine` with the builtin backend: load a model, start the engine loop and serve it over
HTTP (+ bootstrap port). The flags are engine/flags.py's; `laps engine --backend emulated` (and
`--list-profiles`) run emulated/cli.py instead, chosen in laps_agent/cli.py: the engine never
imports the emulated backend, which builds on it."""
from __future__ import annotations

import argparse
import logging
import os
import time
from typing import TYPE_CHECKING

from laps_agent.engine.core.calibration import calibrate_prefill
from laps_agent.engine.core.config import EngineConfig, kv_pages_for_memory
from laps_agent.engine.flags import bucket_grid, build_parser, decode_order, scheduler_config
from laps_agent.engine.http.serve import check_server_flags, run_engine, server_settings
from laps_agent.engine.http.server import EngineServer
from laps_agent.engine.metrics import EngineMetrics
from laps_agent.policy.scheduling.buckets import BucketGrid

if TYPE_CHECKING:
    from laps_agent.engine.engine import Engine

log = logging.getLogger("laps.engine")


def decode_graph_sizes(args: argparse.Namespace, max_running: int) -> list[int]:
    """Decode batch sizes worth a graph: a batch never holds more than max_running requests,
    so sizes beyond the first one that covers it would never replay."""
    if not args.decode_graphs:
        return []
    sizes = sorted(set(args.decode_graph_batch_sizes))
    covering = [b for b in sizes if b >= max_running]
    return [b for b in sizes if b < max_running] + covering[:1]


def graphs_for_role(role: str, grid: BucketGrid | None, decode_sizes: list[int]
                    ) -> tuple[BucketGrid | None, list[int]]:
    """The CUDA graphs worth capturing for a role: (prefill bucket grid, decode batch sizes).
    A decode engine never prefills a prompt (its KV comes from the prefill engine), and a
    prefill engine hands every PD request off after its first token, decoding only requests sent
    to it directly, which run eagerly (SGLang's prefill servers capture no graphs either). Each
    graph costs start-up time and device memory."""
    return (None if role == "decode" else grid), ([] if role == "prefill" else decode_sizes)


def build(args: argparse.Namespace) -> tuple[EngineServer, Engine]:
    """Load everything; returns (EngineServer, engine). Separate from serving so tests and the
    benchmark can build an engine in-process. The builtin backend only: `--backend emulated`
    is emulated/build.py's (laps_agent/cli.py sends `laps engine` there)."""
    if args.backend != "builtin":
        raise ValueError(f"--backend {args.backend} is not built here: run it as `laps engine --backend "
                         f"{args.backend}` (laps_agent/cli.py)")
    # Spinning OpenMP workers steal the cores that other engines on the same node (laps local,
    # CPU pools) need: measured up to 8x slower prefill on 2 shared cores. Must precede torch.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Torch (and the modules below, which import it) after OMP_WAIT_POLICY, once the flags are good.
    # lazy: torch; this module's top stays torch-free (`--help`, a bad flag, `laps local`'s flags)
    import torch

    from laps_agent.engine.engine import Engine
    from laps_agent.engine.model.loader import default_model_path, load_model, resolve_dtype
    from laps_agent.engine.model.runner import ModelRunner
    from laps_agent.engine.pd.kv_codec import TensorKVCodec

    # Check every flag before the (slow) model load.
    check_server_flags(args)
    grid = bucket_grid(args)
    sched = scheduler_config(args, grid, args.max_prefill_tokens or 8192)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device cuda, but torch {torch.__version__} sees no CUDA device "
                         f"(built for CUDA {torch.version.cuda or 'none'})")
    path = args.model or str(default_model_path())
    dtype = resolve_dtype(args.dtype, device)
    log.info("loading model %s on %s (%s) ...", path, device, str(dtype).removeprefix("torch."))
    started = time.monotonic()
    loaded = load_model(path, device=device, dtype=dtype)
    params = sum(p.numel() for p in loaded.model.parameters())
    log.info("model %s loaded: %.1fM parameters, %d layers, context %d (%.1fs)", loaded.name, params / 1e6,
             loaded.config.num_layers, loaded.config.max_position_embeddings, time.monotonic() - started)
    context = loaded.config.max_position_embeddings
    if args.context_length:
        context = min(context, args.context_length)
    num_pages = args.kv_pages or _default_kv_pages(args, loaded, device, context)
    max_running = args.max_running_requests or 32
    graph_grid, decode_sizes = graphs_for_role(args.role, grid, decode_graph_sizes(args, max_running))
    runner = ModelRunner(loaded, num_pages=num_pages, page_size=args.page_size, grid=graph_grid,
                         cuda_graphs=device == "cuda", decode_batch_sizes=decode_sizes,
                         decode_graph_max_context=args.decode_graph_max_context)
    log.info("KV pool: %d pages x %d tokens", num_pages, args.page_size)
    if runner.graphs is not None or runner.decode_graphs is not None:  # not on the request path
        started = time.monotonic()
        runner.capture_graphs(lambda done, total, bucket: log.info(
            "captured CUDA graph %d/%d: batch %d x %d tokens", done, total, bucket.batch_size, bucket.seq_len))
        log.info("CUDA graphs captured in %.1fs", time.monotonic() - started)
    config = EngineConfig(role=args.role, scheduler=sched, batch_prefill_graphs=grid is not None,
                          batch_prefill_graphs_mode=args.batch_prefill_graphs_mode,
                          max_running_requests=max_running, context_len=context,
                          prefix_cache=args.prefix_cache, decode_order=decode_order(args))
    name = args.served_model_name or loaded.name
    metrics = EngineMetrics(args.role, name, args.labels_file, args.bootstrap_timeout)
    engine = Engine(runner, loaded.tokenizer, config, grid=grid,
                    on_prefill=lambda rec: metrics.observe_prefill(rec, grid is not None),
                    on_first_token=metrics.observe_first_token, on_warm=metrics.observe_warm)
    # Before the server listens: /get_load has the figure from the start.
    if samples := calibrate_prefill(engine.core):
        log.info("prefill speed measured: %s", ", ".join(f"{n} tokens in {s * 1e3:.1f} ms" for n, s in samples))
    # Received KV goes to the runner's device, in its dtype.
    codec = TensorKVCodec(runner.device, runner.dtype)
    return EngineServer(engine, server_settings(args, name, max_running), metrics, codec), engine


def _default_kv_pages(args: argparse.Namespace, loaded, device: str, context: int) -> int:
    """CUDA: --mem-fraction of what the model left free; CPU: twice the context (RAM is shared
    with other engines on the node, so no grab-what-is-free there)."""
    if device != "cuda":
        return -(-2 * min(context, 8192) // args.page_size)
    # lazy: torch (build() has imported it by now)
    import torch

    free, _ = torch.cuda.mem_get_info()
    cfg = loaded.config
    dtype_bytes = next(loaded.model.parameters()).element_size()
    return kv_pages_for_memory(free, args.mem_fraction, layers=cfg.num_layers, kv_heads=cfg.num_kv_heads,
                               head_dim=cfg.head_dim, dtype_bytes=dtype_bytes, page_size=args.page_size)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.backend != "builtin" or args.list_profiles:
        parser.error("--backend emulated and --list-profiles are served by `laps engine` "
                             "(laps_agent/cli.py), not by this module")
    return run_engine(args, build)
