"""`laps bench <name>`: benchmarks that print numbers. Each subcommand is the module
`laps_agent.lab.bench.<name>` exposing `main(argv) -> int`, imported only when chosen (so the gateway
benchmark needs no torch and new benchmarks need no registration here)."""
from __future__ import annotations

import importlib
import pkgutil
import sys


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def usage() -> str:
    return "usage: laps bench <benchmark> [options]\n\nbenchmarks: " + ", ".join(available())


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if not name.isidentifier() or name not in available():
        print(f"laps bench: unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__name__}.{name}")
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
