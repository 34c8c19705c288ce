"""`laps bench run URL --workload FILE|NAME`: replay a workload against any OpenAI-compatible
server (the laps gateway, one engine, SGLang's router) and save what every request saw.

Open loop: each planned request is sent at its planned time whether or not earlier ones have
answered, streaming, with `ignore_eos` so it produces exactly its planned output tokens. Per
request: TTFT (first non-empty content event), the gaps between content events (ITL), E2E,
status and errors, usage.prompt_tokens. When the target serves `/laps_status` (the gateway),
its groups and pending work are sampled once a second. Prompts are built lazily per request
with exact token counts in the tokenizer (default: SmolLM2's, what `laps local` serves).

Exit codes: 0 the run completed (failed requests are part of the result), 2 bad arguments, bad
workload, unreadable tokenizer, unreachable target or a result directory that cannot be created,
1 results that cannot be written, 130 interrupted (partial results saved).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import os
import signal
import sys
from pathlib import Path
from typing import Any

from laps_agent.lab.bench._client import StreamClient
from laps_agent.lab.bench._runner import Target, TargetError, probe, run_workload  # noqa: F401 (API)
from laps_agent.lab.results import markdown, save, summarize
from laps_agent.lab.results.turns import summarize_turns, turns_report
from laps_agent.lab.workload import WorkloadError, WorkloadSpec, available_workloads, load_workload
from laps_agent.modelio.model_files import default_model_path
from laps_agent.modelio.tokenizer import load_tokenizer
from laps_agent.serving.flag_types import non_negative, output_dir, positive, slo_seconds, unwritable_dir

RESULTS_DIR = Path("bench-results")  # where results go without --out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laps bench run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="base URL of an OpenAI-compatible server (http://host:port or .../v1)")
    p.add_argument("--workload", required=True,
                   help=f"workload YAML file or built-in name ({', '.join(available_workloads())})")
    p.add_argument("--out", type=output_dir, help="result directory (default bench-results/<time>-<label>)")
    p.add_argument("--seed", type=non_negative(int), help="override the workload's seed")
    p.add_argument("--rate-scale", type=positive(float), default=1.0, help="multiply every phase's rate")
    p.add_argument("--max-requests", type=positive(int), help="stop the plan after N requests")
    p.add_argument("--tokenizer", help="model path (GGUF or HF dir) whose tokenizer sizes the prompts; "
                   "default SmolLM2's; 'none': approximate (one word = one token)")
    p.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--slo", type=slo_seconds, default={}, help="TTFT SLOs in seconds, e.g. short=0.5,long=4")
    p.add_argument("--timeout", type=positive(float, finite=False), default=300.0,
                   help="seconds per request (default 300; inf: none)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="Bearer key for a gateway with API keys (default: $OPENAI_API_KEY, as the "
                        "openai client)")
    p.add_argument("--label", help="name of this run (default: the workload's name)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (a line every 5 s instead)")
    return p


def _error(message: str) -> int:
    print(f"laps bench run: error: {message}", file=sys.stderr, flush=True)
    return 2


def _load_tokenizer(arg: str | None) -> tuple[Any, str | None]:
    if arg and arg.lower() == "none":
        return None, None

    path = arg or str(default_model_path())
    return load_tokenizer(path), path


async def _main_async(args: argparse.Namespace, spec: WorkloadSpec) -> int:
    try:
        target = await probe(args.url, model=args.model, api_key=args.api_key)
    except TargetError as exc:
        return _error(str(exc))
    try:
        tokenizer, tokenizer_name = _load_tokenizer(args.tokenizer)
    except (ValueError, OSError) as exc:  # TokenizerError, ModelLoadError are ValueErrors
        return _error(f"cannot load the tokenizer: {exc}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Ctrl-C/SIGTERM stop the run and keep what it measured. signal.signal, not the loop's
    # add_signal_handler: the asyncio runner's own SIGINT handler would win over the latter.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
    progress = "bar" if not args.no_progress and sys.stdout.isatty() else "lines"
    label = args.label or spec.name
    print(f"[laps bench] {spec.name} -> {args.url} (model {target.model!r}"
          f"{', with /laps_status' if target.has_status else ''})", flush=True)
    try:
        result = await run_workload(args.url, spec, seed=args.seed, rate_scale=args.rate_scale,
                                    max_requests=args.max_requests, tokenizer=tokenizer,
                                    tokenizer_name=tokenizer_name, label=label, timeout=args.timeout,
                                    progress=progress, target=target, stop=stop)
    except WorkloadError as exc:  # found while planning (a jsonl file, a phase too large): nothing sent
        return _error(str(exc))
    result.meta["slo"] = args.slo
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS_DIR / f"{stamp}-{label}"

    try:
        paths = save(result, out, slo=args.slo)
    except OSError as exc:  # a full disk; where it cannot be created was refused before the run
        print(f"laps bench run: error: cannot write the results to {out}: {exc}", file=sys.stderr)
        return 1
    by_phase = len(result.meta["phases"]) > 1
    print()
    print(markdown(summarize(result, slo=args.slo, by_phase=by_phase)))
    print()
    if "prefix" in result.meta:  # a workload with conversations (issue 12)

        print(turns_report([(label, summarize_turns(result))]) + "\n")
    for name, path in paths.items():
        print(f"{name:>16}: {path}")
    if result.meta["interrupted"]:
        print("[laps bench] interrupted: partial results saved", flush=True)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec = load_workload(args.workload)
    except WorkloadError as exc:
        return _error(str(exc))
    try:
        StreamClient(args.url)
    except ValueError as exc:
        return _error(str(exc))
    if args.out is None and (problem := unwritable_dir(RESULTS_DIR)):  # --out is checked as parsed
        return _error(f"cannot write the results to {RESULTS_DIR}/: {problem} (give --out DIR)")
    try:
        import uvloop  # cheaper event loop for the client; part of the serve extra
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        return runner(_main_async(args, spec))
    except KeyboardInterrupt:  # before the run started: nothing to save
        print("laps bench run: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
