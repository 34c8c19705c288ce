"""`laps gateway` as a process (real flags), and `laps bench gateway` printing its numbers.
No timing is asserted: the benchmark's targets are read from its output, not tested here."""
from __future__ import annotations

import json
import subprocess
import sys

from laps_agent.bench.gateway import main as bench_main


def test_bench_gateway_prints_every_number(capsys):
    assert bench_main(["--seconds", "0.5", "--rate", "20", "--concurrency", "4", "--json"]) == 0
    rows = {row["mode"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}
    for mode in ("non-streaming", "streaming (first byte)"):
        assert {"added_p50_ms", "added_p99_ms", "gateway_cpu_ms_per_request"} <= set(rows[mode])
    assert rows["saturation (non-streaming)"]["one_core_req_per_s"] > 0
    assert rows["routing decisions (in-process)"]["decisions_per_s"] > 0


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
