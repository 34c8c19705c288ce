"""`laps operator`: run the kopf operator that reconciles LAPSCluster resources."""
from __future__ import annotations

import argparse
import logging
import os

from laps_operator.naming import OPERATOR_LIVENESS_PORT, OPERATOR_METRICS_PORT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="laps operator",
        description="Reconcile LAPSCluster resources (laps.io/v1alpha1) into prefill/decode/gateway "
                    "workloads and keep each prefill pod's laps.io/prefill-group label.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="watch this namespace (repeatable; glob patterns allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default when no --namespace is given)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, then $KUBECONFIG)")
    parser.add_argument("--metrics-port", type=int, default=OPERATOR_METRICS_PORT,
                        help="port of /metrics with laps_operator_* series (0 = off; default %(default)s)")
    parser.add_argument("--liveness-port", type=int, default=OPERATOR_LIVENESS_PORT,
                        help="port of kopf's liveness endpoint /healthz (0 = off; default %(default)s)")
    parser.add_argument("--bind", default="0.0.0.0", help="address for metrics and liveness (default %(default)s)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                        help="default %(default)s")
    parser.add_argument("-v", "--verbose", action="store_true", help="same as --log-level=debug")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kubeconfig:
        # Both kopf's own login and the official client read it from here.
        os.environ["KUBECONFIG"] = os.path.abspath(args.kubeconfig)

    # lazy: kopf and the handlers load only when the operator runs, so `laps operator --help` stays fast
    import kopf

    from laps_operator import main as _handlers  # noqa: F401  (registers the handlers with kopf)
    from laps_operator import metrics

    if args.metrics_port:
        metrics.serve(args.metrics_port, args.bind)
    liveness = f"http://{args.bind}:{args.liveness_port}/healthz" if args.liveness_port else None
    level = "debug" if args.verbose else args.log_level
    kopf.configure(verbose=level == "debug", quiet=level in ("warning", "error"))
    if level == "error":
        logging.getLogger().setLevel(logging.ERROR)
    # httpx logs every request at INFO: the allocation loop's reads of Prometheus or the
    # gateways would drown everything else.
    logging.getLogger("httpx").setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=liveness,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
