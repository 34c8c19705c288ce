"""The one `laps` command. Subcommands import their module only when chosen, so the operator
image (no torch, no FastAPI) can run `laps operator` and `laps --help`.

`laps engine` has two entry modules, chosen here by its flags: the builtin engine's
(engine/cli.py) and, for `--backend emulated` and `--list-profiles`, the emulated backend's
(emulated/cli.py). The choice is made above both because the emulated backend builds on the
engine, which never imports it."""
from __future__ import annotations

import importlib
import sys

from laps_agent import __version__

# name -> (module exposing `main(argv: list[str]) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("laps_operator.cli", "run the kopf operator that reconciles LAPSCluster resources"),
    "engine": ("laps_agent.engine.cli", "run one builtin LAPS engine server (prefill, decode or mixed role)"),
    "gateway": ("laps_agent.gateway.cli", "run the length-aware OpenAI-compatible gateway"),
    "local": ("laps_agent.local.stack", "run the whole data plane on this machine (gateway + engines, CPU)"),
    "bench": ("laps_agent.lab.bench", "benchmarks that print numbers (run, compare, engine, gateway, profile)"),
    "sim": ("laps_agent.lab.sim", "simulate a whole cluster on the engines' cost-model profiles"),
}
# `laps engine --backend emulated` and `laps engine --list-profiles` (module docstring).
EMULATED_ENGINE = "laps_agent.emulated.cli"


def module_for(name: str, argv: list[str]) -> str:
    """The module that runs subcommand `name` with `argv`."""
    if name == "engine":
        # lazy: the engine's flags load only for `laps engine` (module docstring)
        from laps_agent.engine.flags import build_parser

        # The chosen module parses the same flags again; here only --backend and
        # --list-profiles count (`--help` and a bad flag end here, said as there).
        flags, _ = build_parser().parse_known_args(argv)
        if flags.backend == "emulated" or flags.list_profiles:
            return EMULATED_ENGINE
    return SUBCOMMANDS[name][0]


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
        print(f"laps {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"laps: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(module_for(name, rest))
    try:
        return int(module.main(rest) or 0)
    except Exception as exc:
        # A failure nobody foresaw (a CUDA error at start-up, say) still says its name where
        # Kubernetes shows why the container ended; the traceback goes to the log as ever.
        # lazy: only on a crash
        from laps_agent.serving.exit_reason import record_exit_reason

        record_exit_reason(f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    raise SystemExit(main())
