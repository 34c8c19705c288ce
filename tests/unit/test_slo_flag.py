"""The TTFT SLOs travel as `--slo` text from `laps bench compare` to `laps local`: laps local
must read back the values bench compare was given, and passes the long one's starvation bound to
its engines (the operator's rendering of spec.slo: tests/unit/operator/test_builders.py)."""
import argparse

from laps_agent.engine.flags import long_wait_args
from laps_agent.lab.bench._compare_system import local_args
from laps_agent.policy.classes import LONG
from laps_agent.policy.slo import DEFAULT_TTFT_SLO_S
from laps_agent.policy.systems import system
from laps_agent.serving.flag_types import slo_seconds


def test_bench_compare_gives_laps_local_the_slos_to_the_last_digit():
    slos = {"short": 0.123456789, "long": 3.0}
    args = argparse.Namespace(engine="emulated", prefill=2, decode=1, profile=None, model=None, slo=slos)
    out = local_args(args, system("laps"), [])
    assert slo_seconds(out[out.index("--slo") + 1]) == slos


def test_the_engines_starvation_bound_follows_the_long_slo_unless_its_flag_is_given():
    """What `laps local` and `laps sim` add to the engines' flags from --slo: the default SLO keeps
    the default bound; a tighter long SLO lowers it to 2/3 of the SLO; a looser one never raises it."""
    assert long_wait_args([], DEFAULT_TTFT_SLO_S[LONG]) == ["--max-long-wait-ms", "2000"]
    assert long_wait_args([], 2.0) == ["--max-long-wait-ms", "1333.3"]
    assert long_wait_args([], 30.0) == ["--max-long-wait-ms", "2000"]
    assert long_wait_args(["--max-long-wait-ms", "900"], 2.0) == []
    assert long_wait_args(["--max-long-wait-ms=900"], 2.0) == []
    assert long_wait_args(["--max-long-wait", "900"], 2.0) == []   # argparse takes abbreviations


def test_the_engines_get_the_slos_their_decode_order_counts_deadlines_by():
    """`laps local` and `laps sim` pass their --slo to the engines (decode admission by deadline,
    policy/scheduling/decode_order.py) with the starvation bound, unless the engines' flags set
    their own."""
    from laps_agent.engine.flags import build_parser, decode_order, slo_args
    from laps_agent.policy.slo import ttft_slos

    given = ttft_slos({"short": 0.3, "long": 2.0})
    args = slo_args([], given)
    assert args == ["--slo", "short=0.3,long=2.0", "--max-long-wait-ms", "1333.3"]
    assert decode_order(build_parser().parse_args(args)).ttft_slo_s == given
    assert slo_args(["--slo", "all=1"], given) == ["--max-long-wait-ms", "1333.3"]
