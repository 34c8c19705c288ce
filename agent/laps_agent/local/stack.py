"""`laps local`: the whole data plane on this machine, on loopback.

Starts N prefill and M decode engines (`laps engine` processes: builtin, or emulated with
`--engine emulated --profile NAME|FILE`, which compute nothing, so dozens fit on a small machine)
and this gateway with a static membership (half of the prefill engines short, the rest long, as
the operator splits a new cluster; each engine also gets a labels file naming its group, so it
reports the same group itself), shows progress while the engines load, prints the
OpenAI-compatible URL and serves until Ctrl-C or SIGTERM. Then it answers the requests in flight
(laps_agent/serving/drain.py; a second Ctrl-C stops at once) and stops every engine it started.
Flags it does not know are passed to every engine (LAPS knobs such as --wait-window-ms,
--no-laps-scheduler, --kv-pages, --drain-grace-s)."""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from laps_agent.engine.flags import slo_args
from laps_agent.gateway.allocator import StaticAllocator
from laps_agent.gateway.cli import TOKENS, auth_args_problem, decode_share
from laps_agent.gateway.config import GatewayConfig
from laps_agent.gateway.discovery.membership import StaticSpec
from laps_agent.gateway.estimate import TokenEstimator
from laps_agent.local.discovery import LocalDiscovery
from laps_agent.local.engines import (
    EngineChild,
    engine_flag,
    free_ports,
    served_name,
    shared_gpu_args,
    spawn_engine,
    stop_all,
    unknown_engine_args,
    wait_until_loaded,
    write_labels,
)
from laps_agent.local.planner import LocalPlanner
from laps_agent.local.signals_deferred import SignalsDeferred
from laps_agent.modelio.model_files import default_model_path
from laps_agent.modelio.tokenizer import load_tokenizer, save_tokenizer, tokenizer_problem
from laps_agent.policy.admission import gateway_decode_share
from laps_agent.policy.classes import DEFAULT_LENGTH_THRESHOLD, LONG, SHORT
from laps_agent.policy.groups import initial_short_count
from laps_agent.policy.slo import ttft_slos
from laps_agent.policy.systems import (
    ALLOCATION_DEFAULTS,
    ESTIMATORS,
    ROUTERS,
    SINGLE_POOL_THRESHOLD,
    moves_pods,
    policy_config,
)
from laps_agent.serving.flag_types import non_negative, slo_seconds
from laps_agent.serving.listen import ListenError, bind_listening_socket, run_forever, url_host
from laps_agent.serving.planner_flags import add_planner_flags, planner_config, planner_slo


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laps local", description=__doc__.split("\n")[0],
                                epilog="Other flags are passed to every engine.")
    p.add_argument("--prefill", type=int, default=2, help="prefill engines (default 2)")
    p.add_argument("--decode", type=int, default=1, help="decode engines (default 1)")
    p.add_argument("--engine", choices=("builtin", "emulated"), default="builtin",
                   help="builtin: real model on this machine; emulated: time from a cost-model profile")
    p.add_argument("--profile", help="emulated engines: a profile name or YAML file (default cpu-smollm2)")
    p.add_argument("--model", help="GGUF file or HF model directory (default: SmolLM2-135M); "
                                   "emulated engines read only its tokenizer")
    p.add_argument("--served-model-name", help="default: what the engines report")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="gateway port (0: any free port)")
    p.add_argument("--length-threshold", type=TOKENS, default=DEFAULT_LENGTH_THRESHOLD)
    p.add_argument("--estimator", choices=ESTIMATORS, default="auto",
                   help="the gateway's prompt-length estimate (auto: the model's tokenizer)")
    p.add_argument("--router", choices=ROUTERS, default=GatewayConfig.router,
                   help="the gateway's prefill router (as laps gateway --router)")
    p.add_argument("--max-pending-tokens-per-pod", type=TOKENS, default=None,
                   help="the gateway's admission control: pending prompt tokens per prefill pod "
                        "beyond which a class gets 429, beside the engines' measured bound (0: "
                        "neither; default: laps gateway's)")
    p.add_argument("--slo", type=slo_seconds, default=None,
                   help="TTFT p90 SLOs, e.g. short=0.5,long=3: the gateway's (a long may take a short-group "
                        "engine whenever a short behind its batch would still start in time), the engines' "
                        "starvation bound for long prompts (a share of the long SLO, unless "
                        "--max-long-wait-ms sets it) and, with --autoscale, what the planner sizes for "
                        "(default: laps gateway's)")
    p.add_argument("--max-decode-share", type=decode_share, default=None,
                   help="the gateway's admission control: the share of the decode slots one class "
                        "may hold, beyond which it gets 429 (0: no bound; default: laps gateway's, "
                        "none with --single-pool)")
    # Off by default: laps local serves on loopback for one user. Same meaning as laps gateway's.
    p.add_argument("--api-keys-file", help="the gateway's API keys, one a line: requests then "
                   "need 'Authorization: Bearer <key>' (default: no authentication)")
    p.add_argument("--rate-limit-per-key", type=non_negative(float), default=0.0,
                   help="requests/s per API key, beyond: 429 (0: none; needs --api-keys-file)")
    p.add_argument("--request-deadline-s", type=non_negative(float), default=None,
                   help="the gateway's total time per request: 504, or an SSE error event once "
                        "streaming (0: none; default: laps gateway's)")
    p.add_argument("--prefix-affinity", action=argparse.BooleanOptionalAction, default=True,
                   help="the gateway's cache affinity (as laps gateway --prefix-affinity)")
    p.add_argument("--prefix-warm", action=argparse.BooleanOptionalAction, default=None,
                   help="decode engines send each answer back to its prefill engine to compute into "
                        "its prefix cache when idle, and the gateway expects it there (laps engine / "
                        "laps gateway --prefix-warm; default: with --prefix-affinity, builtin and "
                        "emulated engines)")
    p.add_argument("--single-pool", action="store_true",
                   help="no length classes: every prefill engine serves every length (vanilla PD)")
    alloc = p.add_argument_group("allocation (moving prefill engines between the groups)")
    alloc.add_argument("--allocation", choices=("laps", "reference", "none"), default=None,
                       help="laps: the operator's policy over the gateway's pending work (default with "
                            ">= 2 prefill engines); reference: the reference router's rule; none")
    alloc.add_argument("--no-allocation", dest="allocation", action="store_const", const="none",
                       help="same as --allocation none")
    alloc.add_argument("--allocation-interval", type=float, default=ALLOCATION_DEFAULTS["allocation_interval"],
                       help="seconds between decisions")
    alloc.add_argument("--allocation-ratio", type=float, default=ALLOCATION_DEFAULTS["allocation_ratio"],
                       help="per-pod pressure ratio that triggers a move")
    alloc.add_argument("--min-per-group", type=int, default=ALLOCATION_DEFAULTS["min_per_group"])
    scale = p.add_argument_group("autoscaling (the planner starting and stopping engines: local/planner.py)")
    scale.add_argument("--autoscale", action="store_true",
                       help="size the prefill and decode pools from the SLOs (--prefill/--decode: where they start)")
    add_planner_flags(scale, budget_help="GPUs of both pools together (one an engine with --device cuda)")
    p.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"))
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--workdir", type=Path, help="labels files and engine logs (default: a temp dir)")
    return p


def _say(message: str) -> None:
    print(f"[laps local] {message}", flush=True)


def _model_path(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    return str(default_model_path())


def _plan(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    """(name, role, prefill group) for every engine: the operator's split of a new cluster
    (`initial_short_count`), or one pool (all "short") without length classes."""
    n_short = args.prefill if args.single_pool else initial_short_count(args.prefill)
    plan = [(f"prefill-{i}", "prefill", SHORT if i < n_short else LONG) for i in range(args.prefill)]
    return plan + [(f"decode-{i}", "decode", None) for i in range(args.decode)]


def _serve_gateway(args, children: list[EngineChild], tokenizer, sock, engine_args: list[str],
                   spawn: Callable[[str, str | None], EngineChild], loaded_s: float) -> int:
    # lazy: fastapi (the serve extra) only once the stack serves, not for `bench compare`'s flag checks
    from laps_agent.gateway.http.app import create_app

    def urls(role: str, group: str | None = None) -> tuple[str, ...]:
        return tuple(c.url for c in children if c.role == role and c.group == group)

    spec = StaticSpec(urls("prefill", SHORT), urls("prefill", LONG), urls("decode"))
    # One pool routed least-loaded has no classes (vanilla PD); routed by prediction, the classes
    # still say what each engine's dual queue serves first.
    threshold = SINGLE_POOL_THRESHOLD if args.single_pool and args.router != "predicted" else args.length_threshold
    # The engines' --drain-grace-s is the gateway's too: one Ctrl-C waits that long at most.
    overrides = {"drain_grace_s": engine_flag(engine_args, "drain_grace_s")}
    if args.max_pending_tokens_per_pod is not None:
        overrides["max_pending_tokens_per_pod"] = max(args.max_pending_tokens_per_pod, 0)
    if args.request_deadline_s is not None:
        overrides["request_deadline_s"] = max(args.request_deadline_s, 0.0)
    overrides["max_decode_share"] = gateway_decode_share(args.single_pool, args.max_decode_share)
    config = GatewayConfig(served_model_name=served_name(children, args.served_model_name),
                           length_threshold=threshold, api_keys_file=args.api_keys_file,
                           rate_limit_per_key=max(args.rate_limit_per_key, 0.0),
                           prefix_affinity=args.prefix_affinity, prefix_warm=args.prefix_warm,
                           router=args.router, ttft_slo_s=ttft_slos(args.slo), **overrides)
    discovery = LocalDiscovery(spec, children, _say)
    app = create_app(config, discovery, TokenEstimator(tokenizer, args.estimator),
                     allocator=_allocator(args, children), planner=_planner(args, discovery, children, spawn, loaded_s))
    discovery.on_unservable = app.state.gateway.drain.begin  # answer what is in flight, then stop
    host, port = sock.getsockname()[:2]
    pool = (f"{len(spec.prefill_short)} prefill (one pool)" if args.single_pool else
            f"{len(spec.prefill_short)} short + {len(spec.prefill_long)} long prefill")
    _say(f"model {config.served_model_name!r}: {pool}, {len(spec.decode)} decode engines"
         + (f" (emulated: {args.profile or 'cpu-smollm2'})" if args.engine == "emulated" else ""))
    url = f"http://{url_host(host)}:{port}/v1"
    _say(f"OpenAI-compatible API: {url}   (Ctrl-C stops everything)")
    _say(f"try: {_example_curl(url, config.served_model_name, args.api_keys_file)}")
    # Returns on SIGINT/SIGTERM once the requests in flight are answered (laps_agent/serving/drain.py).
    code = run_forever(app, sock, drain=app.state.gateway.drain, log_level="warning")
    return 1 if discovery.unservable else code


def _example_curl(url: str, model: str, api_keys_file: str | None) -> str:
    """A request to paste into a shell as printed: the served name is the one model the gateway
    accepts (any other is a 404)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}],
                       "max_tokens": 32})
    auth = " -H 'Authorization: Bearer YOUR_KEY'" if api_keys_file else ""
    return f"curl -s {url}/chat/completions -H 'Content-Type: application/json'{auth} -d {shlex.quote(body)}"


class _LabelsFiles(Mapping):
    """URL -> labels file of the prefill engines running now (the planner adds engines)."""

    def __init__(self, children: list[EngineChild]) -> None:
        self._children = children

    def _files(self) -> dict:
        return {c.url: c.labels_path for c in self._children if c.role == "prefill"}

    def __getitem__(self, url: str):
        return self._files()[url]

    def __iter__(self):
        return iter(self._files())

    def __len__(self) -> int:
        return len(self._files())


def _planner(args, discovery: LocalDiscovery, children: list[EngineChild], spawn, loaded_s: float):
    """The gateway's planner over these engines (--autoscale), or None."""
    if not args.autoscale:
        return None
    config = planner_config(args, gpus_per_pod=0 if args.device == "cpu" else 1, startup_s=loaded_s)
    slo = planner_slo(args)
    return lambda gateway: LocalPlanner(gateway, discovery, spawn, _stop_engine, children, config, slo, _say)


def _stop_engine(child: EngineChild, grace_s: float = 30.0) -> None:
    """SIGTERM one engine (it finishes what it holds), SIGKILL if it is still there after `grace_s`."""
    child.told_to_stop = True
    child.process.terminate()
    try:
        child.process.wait(grace_s)
    except subprocess.TimeoutExpired:
        child.process.kill()
        child.process.wait(5)


def _allocator(args, children: list[EngineChild]):
    """The gateway's allocation loop over these engines, or None (see --allocation)."""
    if not moves_pods(args.allocation, args.single_pool, args.prefill):
        return None
    config = policy_config(args)
    labels = _LabelsFiles(children)

    def relabel(path, group: str) -> None:
        write_labels(path, "prefill", group)

    return lambda gateway: StaticAllocator(
        gateway.discovery, gateway.tracker, gateway.metrics, mode=args.allocation or "laps",
        interval_s=args.allocation_interval, config=config, labels=labels, write_labels=relabel)


def _terminate_on_sigterm() -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def args_problem(args: argparse.Namespace, engine_args: list[str]) -> str | None:
    """Why these flags cannot start a stack, one line, or None (`bench compare` checks with it too)."""
    if args.prefill < 1 or args.decode < 1:
        return "need at least one prefill and one decode engine"
    if not args.allocation_interval > 0 or not args.allocation_ratio >= 1 or args.min_per_group < 1:
        return "--allocation-interval must be > 0, --allocation-ratio >= 1, --min-per-group >= 1"
    if args.allocation not in (None, "none") and args.prefill < 2 * args.min_per_group:
        return (f"--allocation {args.allocation} needs at least {2 * args.min_per_group} prefill engines "
                f"(--min-per-group {args.min_per_group} in each group), got --prefill {args.prefill}")
    if args.autoscale:
        try:
            planner_config(args, gpus_per_pod=0 if args.device == "cpu" else 1, startup_s=0.0)
        except ValueError as exc:
            return f"--autoscale: {exc}"
    # Before minutes of loading, not after (and in every system of `bench compare`).
    return auth_args_problem(args) or unknown_engine_args(engine_args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, engine_args = parser.parse_known_args(argv)
    if problem := args_problem(args, engine_args):
        parser.error(problem)
    try:  # the gateway's port too: a port in use is said at once, not after the loading
        sock = bind_listening_socket(args.host, args.port)
    except ListenError as err:
        hint = " (another laps local? --port 0 picks a free port)" if "in use" in str(err) else ""
        parser.exit(1, f"laps local: error: {err}{hint}\n")
    if args.prefix_warm is None:  # warming pays only where the next turn comes back to the pod
        args.prefix_warm = args.prefix_affinity
    _terminate_on_sigterm()  # loading is interruptible by SIGTERM too, with the same clean-up
    # A temp dir of our own goes after a clean stop; kept (and said) when its logs may say why not.
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="laps-local-"))
    workdir.mkdir(parents=True, exist_ok=True)
    children: list[EngineChild] = []
    code = 1
    try:
        try:
            model = _model_path(args)
            tokenizer = load_tokenizer(model)
        except (ValueError, OSError) as exc:  # TokenizerError (a GGUF or HF dir it cannot read), OSError
            raise RuntimeError(tokenizer_problem(args.model or "the default model", exc)) from None
        backend: list[str] = []
        engine_model = model
        if args.engine == "emulated":
            backend = ["--backend", "emulated", *(["--profile", args.profile] if args.profile else [])]
            # Emulated engines need only the tokenizer: read once here, saved in the form that
            # loads in 0.1 s, instead of every engine parsing the model file.
            engine_model = str(save_tokenizer(tokenizer, workdir / "tokenizer"))
        plan = _plan(args)
        # With --autoscale, the GPU split makes room for the most engines the planner may run.
        most = args.prefill_max + args.decode_max if args.autoscale else len(plan)
        gpu_split, gpu_line = (shared_gpu_args(args.device, engine_args, max(most, len(plan)))
                               if args.engine == "builtin" else ([], None))
        # Parsed before "starting" is said: a Ctrl-C between that line and the first engine's
        # start ends without a "stopped" line, so nothing slow belongs there.
        slo = slo_args(engine_args, ttft_slos(args.slo))
        _say(f"starting {args.prefill} prefill + {args.decode} decode {args.engine} engines on {model} "
             f"(logs in {workdir})")
        if gpu_line:
            _say(gpu_line)
        common = [*backend, "--device", args.device, "--length-threshold", str(args.length_threshold),
                  "--prefix-warm" if args.prefix_warm else "--no-prefix-warm", *engine_args, *gpu_split,
                  *slo,
                  *(["--served-model-name", args.served_model_name] if args.served_model_name else [])]
        counts = {"prefill": args.prefill, "decode": args.decode}

        def spawn(role: str, group: str | None, name: str | None = None) -> EngineChild:
            """One engine with ports of its own (free_ports): an API port, and a bootstrap (KV
            hand-off) port for a prefill engine; the planner's get the next free name."""
            if name is None:
                name, counts[role] = f"{role}-{counts[role]}", counts[role] + 1
            ports = iter(free_ports(2 if role == "prefill" else 1))
            return spawn_engine(name, role, group, model=engine_model, workdir=workdir, port=next(ports),
                                bootstrap_port=next(ports) if role == "prefill" else None, common_args=common)

        started = time.monotonic()
        with SignalsDeferred():   # every engine forked is in `children`, for stop_all
            for name, role, group in plan:
                children.append(spawn(role, group, name))
        wait_until_loaded(children, args.startup_timeout, _say)
        code = _serve_gateway(args, children, tokenizer, sock, engine_args, spawn, time.monotonic() - started)
    except KeyboardInterrupt:
        code = 0
    except RuntimeError as exc:
        _say(f"error: {exc}")
    finally:
        sock.close()
        if children:
            killed = stop_all(children, _say)
            _say("stopped now: engines killed" if killed else "stopped")
            if killed and code == 0:
                code = 130  # interrupted, as after a second signal during the gateway's drain
        # An engine that died mid-run (its log named then) fails it, even if the rest served on.
        if args.workdir is None and (not children or code == 0 and all(c.stopped_cleanly for c in children)):
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.workdir is None:
            _say(f"engine logs kept in {workdir}")
    return code


if __name__ == "__main__":
    sys.exit(main())
