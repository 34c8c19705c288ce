"""`laps gateway` as a process (real flags), and `laps bench gateway` printing its numbers.
No timing is asserted: the benchmark's targets are read from its output, not tested here."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from laps_agent.lab.bench.gateway import main as bench_main


def test_bench_gateway_prints_every_number(capsys):
    assert bench_main(["--seconds", "0.5", "--sizes", "1,40", "--clients", "1,2",
                       "--scale-clients", "4", "--json"]) == 0
    rows = {row["mode"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}
    for mode in ("1 KiB, 1 client", "1 KiB, 1 client, streaming (first byte)", "1 KiB, 2 clients",
                 "40 KiB, 1 client", "40 KiB, 2 clients"):
        assert rows[mode]["requests"] > 0
        assert {"added_p50_ms", "added_p99_ms", "gateway_cpu_ms_per_request"} <= set(rows[mode])
    # the targets travel with the cells they apply to
    assert {"before_added_p50_ms", "target_added_p50_ms", "target_cpu_ms", "target_met"} <= set(
        rows["40 KiB, 1 client"])
    assert rows["1 KiB, 1 client (control: direct calls of 40 KiB)"]["gateway_cpu_ms_per_request"] > 0
    scale_out = rows["scale-out (1 KiB, 4 clients)"]
    assert scale_out["one_gateway_req_per_s"] > 0 and scale_out["two_gateways_req_per_s"] > 0
    assert scale_out["target_ratio"] == 1.8
    # over compute-free stubs, with the ceiling this machine's cores allow
    assert scale_out["gateway_cpu_ms_per_request"] > 0
    assert scale_out["load_generator_and_upstreams_cpu_ms_per_request"] > 0
    assert 1.0 <= scale_out["ceiling_ratio_on_these_cores"] <= 2.0
    assert rows["routing decisions (in-process)"]["decisions_per_s"] > 0


def test_bench_gateway_prints_a_table_with_its_targets(capsys):
    assert bench_main(["--seconds", "0.3", "--sizes", "1", "--clients", "1", "--no-scale-out"]) == 0
    out = capsys.readouterr().out
    assert "added p50" in out and "target p50/CPU" in out
    assert "1 KiB, 1 client" in out and "routing decisions" in out


def test_gateway_cli_rejects_incomplete_static_flags():
    result = subprocess.run([sys.executable, "-m", "laps_agent.cli", "gateway",
                             "--prefill-short", "http://127.0.0.1:1"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--decode" in result.stderr
    result = subprocess.run([sys.executable, "-m", "laps_agent.cli", "gateway",
                             "--decode", "not-a-url", "--prefill-short", "http://127.0.0.1:1"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "http://host:port" in result.stderr


def test_gateway_flags_set_admission_control_and_the_ejection_cap():
    from laps_agent.gateway.cli import build_parser, config_from_args
    from laps_agent.gateway.config import GatewayConfig, ProxyConfig

    default = config_from_args(build_parser().parse_args([]))
    assert default.max_pending_tokens_per_pod == GatewayConfig.max_pending_tokens_per_pod > 0
    assert default.proxy.max_ejection_percent == ProxyConfig.max_ejection_percent == 50
    config = config_from_args(build_parser().parse_args(
        ["--max-pending-tokens-per-pod", "0", "--max-ejection-percent", "30"]))
    assert (config.max_pending_tokens_per_pod, config.proxy.max_ejection_percent) == (0, 30)


def test_an_engine_may_stay_silent_as_long_as_the_request_deadline_allows(capsys):
    """A non-streamed answer sends nothing until it is complete. The silence bound was a fixed
    300 s under a 600 s deadline: a long answer the deadline allows got 504 at 300 s, and its
    healthy decode pod was counted as failing (three of those ejected it)."""
    from laps_agent.gateway.cli import build_parser, config_from_args

    def silence(*argv: str) -> float:
        return config_from_args(build_parser().parse_args(list(argv))).upstream_silence_s

    assert silence() == 600.0                                  # the default deadline
    assert silence("--request-deadline-s", "1800") == 1800.0
    assert silence("--request-deadline-s", "0") == 300.0        # no deadline: still bounded
    assert silence("--request-deadline-s", "1800", "--read-timeout", "45") == 45.0  # as asked
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--read-timeout", "0"])
    assert "--read-timeout: 0: seconds, more than 0" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, says", [
    ("--max-retries", "-1", "must be >= 0"),              # every request was a 500 (AttributeError)
    ("--connect-timeout", "0", "must be > 0"),            # every connect timed out: 502s, pods ejected
    ("--engine-load-interval", "0", "must be > 0"),
    ("--max-ejection-percent", "200", "0..100"),
    ("--max-pending-tokens-per-pod", "-5", "must be >= 0"),
    ("--length-threshold", "-1", "must be >= 0"),
    ("--max-body-bytes", "0", "must be > 0"),
    ("--eject-after-failures", "0", "must be > 0"),
    ("--drain-grace-s", "-1", "must be >= 0"),
    ("--rate-limit-per-key", "nan", "must be >= 0"),
])
def test_gateway_flags_out_of_range_are_refused_naming_the_flag(capsys, flag, value, says):
    from laps_agent.gateway.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args([flag, value])
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and says in err


def test_a_short_engine_silence_bound_does_not_cut_a_pausing_client():
    """A streaming client is dropped after --client-stall-s without reading; by default the
    engines' silence bound, but never under a minute: --read-timeout set short to catch hung
    engines must not cut a client that pauses to work on what it got."""
    from laps_agent.gateway.cli import build_parser, config_from_args

    def stall(*argv: str) -> float:
        return config_from_args(build_parser().parse_args(list(argv))).client_stall_s

    assert stall() == 600.0                                     # the deadline's silence bound
    assert stall("--read-timeout", "5") == 60.0
    assert stall("--read-timeout", "5", "--client-stall-s", "2") == 2.0


def test_gateway_flags_set_engine_load_polling():
    from laps_agent.gateway.cli import build_parser, config_from_args

    default = config_from_args(build_parser().parse_args([]))
    assert (default.engine_load_poll, default.engine_load_interval_s) == (True, 0.25)
    config = config_from_args(build_parser().parse_args(
        ["--no-engine-load-poll", "--engine-load-interval", "0.25"]))
    assert (config.engine_load_poll, config.engine_load_interval_s) == (False, 0.25)


def test_scale_out_ceiling_is_what_the_cores_leave_two_gateways():
    from laps_agent.lab.bench._gateway_report import scale_out_ceiling

    # 0.2 ms per request in a gateway, 0.05 ms in the load generator and upstreams
    assert scale_out_ceiling(2, 0.2, 0.05) == pytest.approx(1.6)   # 2 cores: 8,000 vs 5,000 req/s
    assert scale_out_ceiling(16, 0.2, 0.05) == pytest.approx(2.0)  # room for both gateways
    assert scale_out_ceiling(1, 0.2, 0.05) == pytest.approx(1.0)   # one core: no gain at all


@pytest.mark.parametrize("flag, value, message", [
    ("--sizes", "0", "expected positive integers"),
    ("--clients", "1,0", "expected positive integers"),
    ("--clients", "x", "expected comma-separated integers"),
    ("--seconds", "nan", "must be > 0"),
    ("--scale-clients", "0", "must be > 0"),
])
def test_bench_gateway_refuses_values_that_measure_nothing(capsys, flag, value, message):
    """They used to start the stack and end in a traceback (an empty sample, a 400 from a 0 KiB body)."""
    with pytest.raises(SystemExit) as exit_:
        bench_main([flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {message}" in err
