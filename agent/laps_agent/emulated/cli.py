"""`laps engine --backend emulated` (and `laps engine --list-profiles`): the flags of `laps engine`
(engine/flags.py) -> an emulated engine server (build.py), served as the builtin engine is
(engine/http/serve.py). laps_agent/cli.py sends `laps engine` here by its flags: the engine never
imports the emulated backend, which builds on it."""
from __future__ import annotations

import uvloop

from laps_agent.emulated.build import build_emulated
from laps_agent.emulated.profile import available_profiles, load_profile
from laps_agent.engine.flags import build_parser
from laps_agent.engine.http.serve import run_engine


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_profiles:
        for name in available_profiles():
            profile = load_profile(name)
            print(f"{name:28s} {profile.provenance}: {profile.description}")
        return 0
    if args.backend != "emulated":
        parser.error("this module serves --backend emulated and --list-profiles; "
                             "`laps engine` chooses it (laps_agent/cli.py)")
    # The emulated engine lives on the event loop itself: uvloop costs it half the CPU.
    return run_engine(args, build_emulated, run=uvloop.run)
