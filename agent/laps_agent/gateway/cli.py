"""`laps gateway`: flags (docs/contracts.md) -> a uvicorn-served gateway."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import NoReturn

from laps_agent.gateway.config import GatewayConfig, ProxyConfig
from laps_agent.gateway.discovery.kubernetes import KubernetesDiscovery, ServiceNames
from laps_agent.gateway.discovery.membership import Discovery, StaticDiscovery, StaticSpec, split_urls
from laps_agent.gateway.estimate import TokenEstimator
from laps_agent.gateway.http.auth import read_keys
from laps_agent.modelio.tokenizer import load_tokenizer, tokenizer_problem
from laps_agent.policy.classes import DEFAULT_LENGTH_THRESHOLD
from laps_agent.policy.routing import AffinityBound
from laps_agent.policy.slo import ttft_slos
from laps_agent.policy.systems import ESTIMATORS, ROUTERS
from laps_agent.serving.exit_reason import ExitRecordingParser
from laps_agent.serving.flag_types import at_least, non_negative, positive, slo_seconds, slo_text
from laps_agent.serving.listen import ListenError, bind_listening_socket, run_forever, url_host

# The types of flags laps local shares: a count of tokens (0 means something for each: every
# prompt long, no slack, no bound), a positive time. A wrong value was taken and failed later, or
# never: --max-retries -1 made every request a 500, --connect-timeout 0 every one a 502.
TOKENS = non_negative(int)
SECONDS = positive(float)


def percent(text: str) -> int:
    """--max-ejection-percent's type: 0..100."""
    value = non_negative(int)(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"must be a percentage, 0..100, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = ExitRecordingParser(prog="laps gateway", description="length-aware PD gateway")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--length-threshold", type=TOKENS, default=DEFAULT_LENGTH_THRESHOLD)
    p.add_argument("--served-model-name", default="default")
    p.add_argument("--tokenizer", help="model path (GGUF or HF dir) whose tokenizer counts "
                   "prompt tokens; without it a characters-per-token heuristic is used")
    p.add_argument("--estimator", choices=ESTIMATORS, default="auto",
                   help="prompt-length estimate: auto (the tokenizer if given, else the heuristic), "
                        "heuristic, or chars4 (the reference router's characters/4)")
    p.add_argument("--router", choices=ROUTERS, default=GatewayConfig.router,
                   help="predicted: each request to the prefill pod where its predicted time to first "
                        "token is lowest, the length groups a preference (policy/placement.py); "
                        "least-loaded: to its class's group, the pod with the fewest pending tokens")
    p.add_argument("--discovery", choices=("static", "kubernetes"), default="static")
    p.add_argument("--engine-load-poll", action=argparse.BooleanOptionalAction,
                   default=GatewayConfig.engine_load_poll,
                   help="route by the engines' own load (each pod's /get_load, polled), merged "
                        "with this gateway's dispatches: several gateway replicas then share it")
    p.add_argument("--engine-load-interval", type=SECONDS, default=GatewayConfig.engine_load_interval_s,
                   help="seconds between two polls of every pod's /get_load")
    aff = p.add_argument_group("cache affinity (gateway/routing.py)")
    aff.add_argument("--prefix-affinity", action=argparse.BooleanOptionalAction,
                     default=GatewayConfig.prefix_affinity,
                     help="send a prompt to the prefill pod expected to hold its prefix (this "
                          "gateway's record of what it sent where) and classify it by the tokens "
                          "left to prefill there; off: full-length classes, least-loaded pods")
    aff.add_argument("--affinity-load-factor", type=at_least(float, 1.0), default=AffinityBound().load_factor,
                     help="a pod with more pending tokens than this x its group's mean (plus "
                          "--affinity-slack-tokens) loses affinity")
    aff.add_argument("--affinity-slack-tokens", type=TOKENS, default=AffinityBound().slack_tokens)
    aff.add_argument("--prefix-warm", action=argparse.BooleanOptionalAction, default=GatewayConfig.prefix_warm,
                     help="the engines run with --prefix-warm: expect the pod that served a chat's "
                          "previous turn to hold its answer too")
    aff.add_argument("--prefix-record-blocks", type=positive(int), default=GatewayConfig.prefix_record_blocks_per_pod,
                     help="blocks (a chat message, or a tier block of a text: 256 characters and up) remembered per prefill pod (LRU)")
    static = p.add_argument_group("static discovery")
    static.add_argument("--prefill-short", default="", help="URL[,URL...]")
    static.add_argument("--prefill-long", default="", help="URL[,URL...]")
    static.add_argument("--decode", default="", help="URL[,URL...]")
    static.add_argument("--membership-file", type=Path, help="JSON/YAML file with keys "
                        "prefill_short, prefill_long, decode (URL lists), re-read when it changes")
    kube = p.add_argument_group("kubernetes discovery")
    kube.add_argument("--namespace", default=None, help="default: the pod's own namespace")
    kube.add_argument("--prefill-short-service")
    kube.add_argument("--prefill-long-service")
    kube.add_argument("--decode-service")
    limits = p.add_argument_group("limits and resilience")
    limits.add_argument("--max-body-bytes", type=positive(int), default=GatewayConfig.max_body_bytes)
    limits.add_argument("--connect-timeout", type=SECONDS, default=ProxyConfig.connect_timeout_s)
    limits.add_argument("--read-timeout", type=positive_seconds, default=None,
                        help="seconds an engine may stay silent on an open request (a non-streamed "
                             "answer is silent until complete) before 504; default: the request "
                             "deadline, or 300 without one")
    limits.add_argument("--client-stall-s", type=SECONDS, default=None,
                        help="seconds a streaming client may take no bytes (its connection backed "
                             "up) before the gateway drops it and frees its decode slot; default: "
                             "the --read-timeout bound, at least 60")
    limits.add_argument("--max-retries", type=non_negative(int), default=ProxyConfig.max_retries)
    limits.add_argument("--eject-after-failures", type=positive(int),
                        default=ProxyConfig.eject_after_failures)
    limits.add_argument("--eject-seconds", type=non_negative(float), default=ProxyConfig.eject_seconds)
    limits.add_argument("--max-ejection-percent", type=percent, default=ProxyConfig.max_ejection_percent,
                        help="most of a prefill group or of the decode pool that passive health "
                             "checks may eject; never its last healthy pod (0: never eject)")
    limits.add_argument("--max-pending-tokens-per-pod", type=TOKENS,
                        default=GatewayConfig.max_pending_tokens_per_pod,
                        help="admission control: a prefill group takes new requests while its "
                             "pending prompt tokens are below this many per routable pod; beyond, "
                             "its class gets 429 + Retry-After; so does a request that would not fit "
                             "within what the pod it goes to reports it prefills in time (0: neither)")
    limits.add_argument("--slo", type=slo_seconds, default=None,
                        help="TTFT p90 SLOs per class, e.g. short=0.5,long=3 (default: "
                             + slo_text(ttft_slos())
                             + "): with --router predicted a long request may take a short-group pod "
                               "whenever a short arriving behind its batch would still start in time")
    limits.add_argument("--max-decode-share", type=decode_share, default=GatewayConfig.max_decode_share,
                        help="admission control: each class may hold at most this share of the "
                             "decode pool's slots (its pods' max running requests, from their "
                             "load reports); beyond, that class gets 429 + Retry-After, so a flood "
                             "of one class never leaves the other without decode slots (0: no bound)")
    limits.add_argument("--request-deadline-s", type=non_negative(float), default=GatewayConfig.request_deadline_s,
                        help="total time a request may take, arrival to last byte: beyond, 504 "
                             "(or, once a stream has begun, an SSE error event ends it); 0: none")
    limits.add_argument("--drain-grace-s", type=non_negative(float), default=GatewayConfig.drain_grace_s,
                        help="after SIGTERM/SIGINT: unready at once, new requests get 503 draining, "
                             "the ones in flight finish; exit when none is left or after this many "
                             "seconds (keep it below the pod's terminationGracePeriodSeconds)")
    auth = p.add_argument_group("authentication (gateway/auth.py)")
    auth.add_argument("--api-keys-file", help="file of API keys, one a line (a mounted Secret); "
                      "every endpoint but /health, /live, /metrics and the OpenAPI docs then needs "
                      "'Authorization: Bearer <key>' (401 without); re-read when it changes. "
                      "Default: no authentication")
    auth.add_argument("--rate-limit-per-key", type=non_negative(float), default=GatewayConfig.rate_limit_per_key,
                      help="requests/s each API key may send (burst: one second's worth, at least 1); "
                           "beyond, 429 + Retry-After. 0: no limit. Needs --api-keys-file")
    p.add_argument("--log-level", default="info")
    return p


def decode_share(text: str) -> float:
    """--max-decode-share's type (laps gateway and laps local): a share in 0..1."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: a share of the decode slots, 0..1 (0: no bound)")
    return value


def positive_seconds(text: str) -> float:
    """--read-timeout's type: a time > 0 (0 would time every request out at once)."""
    value = float(text)
    if not value > 0:  # also NaN
        raise argparse.ArgumentTypeError(f"{text}: seconds, more than 0")
    return value


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The flags' types (build_parser) hold their bounds: no value is clamped here."""
    return GatewayConfig(
        served_model_name=args.served_model_name, length_threshold=args.length_threshold,
        max_body_bytes=args.max_body_bytes,
        max_pending_tokens_per_pod=args.max_pending_tokens_per_pod,
        max_decode_share=args.max_decode_share, ttft_slo_s=ttft_slos(args.slo), router=args.router,
        request_deadline_s=args.request_deadline_s, drain_grace_s=args.drain_grace_s,
        engine_load_poll=args.engine_load_poll,
        # Any interval above 0 passes the flag; polling faster than every 10 ms is no use.
        engine_load_interval_s=max(args.engine_load_interval, 0.01),
        api_keys_file=args.api_keys_file, rate_limit_per_key=args.rate_limit_per_key,
        prefix_affinity=args.prefix_affinity, prefix_warm=args.prefix_warm,
        prefix_record_blocks_per_pod=args.prefix_record_blocks,
        affinity_bound=AffinityBound(args.affinity_load_factor, args.affinity_slack_tokens),
        proxy=ProxyConfig(connect_timeout_s=args.connect_timeout, read_timeout_s=args.read_timeout,
                          client_stall_s=args.client_stall_s,
                          max_retries=args.max_retries,
                          eject_after_failures=args.eject_after_failures,
                          eject_seconds=args.eject_seconds,
                          max_ejection_percent=args.max_ejection_percent))


def discovery_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Discovery:
    if args.discovery == "kubernetes":
        missing = [f for f in ("prefill_short_service", "prefill_long_service", "decode_service")
                   if not getattr(args, f)]
        if missing:
            parser.error("kubernetes discovery needs " + ", ".join(
                "--" + m.replace("_", "-") for m in missing))
        return KubernetesDiscovery(
            ServiceNames(args.prefill_short_service, args.prefill_long_service, args.decode_service),
            namespace=args.namespace)
    if args.membership_file is not None:
        try:
            return StaticDiscovery(file=args.membership_file)
        except (OSError, ValueError) as exc:
            parser.error(f"--membership-file {args.membership_file}: {exc}")
    try:
        spec = StaticSpec(split_urls(args.prefill_short), split_urls(args.prefill_long),
                          split_urls(args.decode))
    except ValueError as exc:
        parser.error(str(exc))
    if not spec.decode or not (spec.prefill_short or spec.prefill_long):
        parser.error("static discovery needs --decode and at least one of --prefill-short/--prefill-long")
    return StaticDiscovery(spec)


def auth_args_problem(args: argparse.Namespace) -> str | None:
    """Why the API-key flags cannot be used, one line, or None: a keys file that cannot be used
    stops the gateway at start (rather than serving everyone 401, or everyone unauthenticated)."""
    if args.rate_limit_per_key > 0 and not args.api_keys_file:
        return "--rate-limit-per-key counts requests per API key: it needs --api-keys-file"
    if args.api_keys_file:
        try:
            read_keys(Path(args.api_keys_file))
        except OSError as exc:
            return f"--api-keys-file {args.api_keys_file}: {exc.strerror}"
        except UnicodeDecodeError:  # its message quotes file bytes: a key's, maybe
            return f"--api-keys-file {args.api_keys_file}: not UTF-8 text"
        except ValueError as exc:
            return f"--api-keys-file: {exc}"
    return None


def check_auth_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if problem := auth_args_problem(args):
        parser.error(problem)


def build_estimator(tokenizer_path: str | None, mode: str = "auto"):
    if not tokenizer_path or mode != "auto":
        return TokenEstimator(None, mode)
    return TokenEstimator(load_tokenizer(tokenizer_path))


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_auth_args(args, parser)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # lazy: fastapi (the serve extra) only once the gateway serves, not for importers of its flags
    from laps_agent.gateway.http.app import create_app

    def cannot_start(reason: str) -> NoReturn:   # the parser leaves it as the exit reason too
        parser.exit(1, f"laps gateway: error: {reason}\n")

    try:
        estimator = build_estimator(args.tokenizer, args.estimator)
    except (ValueError, OSError) as err:   # TokenizerError, an unreadable file: a wrong model path or volume
        cannot_start(tokenizer_problem(args.tokenizer, err))
    app = create_app(config_from_args(args), discovery_from_args(args, parser), estimator)
    try:
        sock = bind_listening_socket(args.host, args.port)  # --port 0: the kernel picks; printed below
    except ListenError as err:
        cannot_start(str(err))
    host, port = sock.getsockname()[:2]
    print(f"laps gateway listening on http://{url_host(host)}:{port}", flush=True)
    return run_forever(app, sock, drain=app.state.gateway.drain, log_level=args.log_level.lower())
