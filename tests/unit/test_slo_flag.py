"""The TTFT SLOs travel as `--slo` text from `laps bench compare` to `laps local`: laps local
must read back the values bench compare was given (the operator's rendering of spec.slo for the
gateway: tests/unit/operator/test_builders.py)."""
import argparse

from laps_agent.lab.bench._compare_system import local_args
from laps_agent.policy.systems import system
from laps_agent.serving.flag_types import slo_seconds


def test_bench_compare_gives_laps_local_the_slos_to_the_last_digit():
    slos = {"short": 0.123456789, "long": 3.0}
    args = argparse.Namespace(engine="emulated", prefill=2, decode=1, profile=None, model=None, slo=slos)
    out = local_args(args, system("laps"), [])
    assert slo_seconds(out[out.index("--slo") + 1]) == slos
