"""The one `laps` command. Subcommands import their module only when chosen, so the operator
image (no torch, no FastAPI) can run `laps operator` and `laps --help`."""
from __future__ import annotations

import importlib
import sys

# name -> (module exposing `main(argv: list[str]) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("laps_operator.cli", "run the kopf operator that reconciles LAPSCluster resources"),
    "engine": ("laps_agent.engine.cli", "run one builtin LAPS engine server (prefill, decode or mixed role)"),
    "gateway": ("laps_agent.gateway.cli", "run the length-aware OpenAI-compatible gateway"),
    "local": ("laps_agent.local.stack", "run the whole data plane on this machine (gateway + engines, CPU)"),
    "bench": ("laps_agent.lab.bench", "benchmarks that print numbers (run, compare, engine, gateway, profile)"),
    "sim": ("laps_agent.lab.sim", "simulate a whole cluster on the engines' cost-model profiles"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: laps <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `laps <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] == "--version":
        from laps_agent import __version__

        print(f"laps {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"laps: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except Exception as exc:
        # A failure nobody foresaw (a CUDA error at start-up, say) still says its name where
        # Kubernetes shows why the container ended; the traceback goes to the log as ever.
        from laps_agent.serving.exit_reason import record_exit_reason

        record_exit_reason(f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    raise SystemExit(main())
