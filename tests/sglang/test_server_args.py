"""The operator's rendered SGLang command parses with SGLang's own ServerArgs parser — for the
examples and for both roles — so a `backend: sglang` pod does not die on an unknown flag."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.sglang.conftest import require_sglang
from tests.sglang.servers import run_in_sglang_venv

pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[2]

PARSE = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
out = []
for argv in json.loads(sys.argv[1] if len(sys.argv) > 1 else CASES):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)  # exits non-zero, naming the flag, on anything unknown
    out.append({k: getattr(ns, k) for k in ("model_path", "disaggregation_mode",
                "disaggregation_transfer_backend", "disaggregation_bootstrap_port", "tp_size", "port",
                "disable_radix_cache")})
print("RESULT" + json.dumps(out))
"""


def _rendered_cases():
    from laps_operator.engine_args import sglang_engine_command
    from laps_operator.spec import parse_spec

    cases = []
    for path in sorted((REPO / "examples").glob("lapscluster*.yaml")):
        body = yaml.safe_load(path.read_text())["spec"]
        body["engine"] = {**body.get("engine", {}), "backend": "sglang"}
        body.setdefault("engine", {}).pop("maxQueuedRequests", None)
        # Each example as written, and with the prefix cache off (--disable-radix-cache).
        no_cache = {**body, "laps": {**body.get("laps", {}), "prefixCache": False, "prefixAffinity": False}}
        for name, spec in ((path.name, parse_spec(body)), (f"{path.name} prefixCache=false", parse_spec(no_cache))):
            for role in ("prefill", "decode"):
                command, args = sglang_engine_command(spec, role)
                assert command == ["python3", "-m", "sglang.launch_server"]
                cases.append((name, role, spec, args))
    return cases


def test_rendered_commands_parse_with_sglang_server_args():
    require_sglang()
    cases = _rendered_cases()
    code = PARSE.replace("CASES", repr(json.dumps([args for *_, args in cases])))
    done = run_in_sglang_venv(code)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    parsed = json.loads(lines[-1][len("RESULT"):])
    for (name, role, spec, _), got in zip(cases, parsed, strict=True):
        pool = spec.prefill if role == "prefill" else spec.decode
        assert got["disaggregation_mode"] == role, name
        assert got["model_path"] == spec.model.path and got["port"] == 30000, name
        assert got["disaggregation_transfer_backend"] == spec.engine.sglang.transfer_backend, name
        assert got["tp_size"] == pool.tensor_parallel_size, name
        assert got["disable_radix_cache"] is (not spec.laps.prefix_cache), name
        if role == "prefill":
            assert got["disaggregation_bootstrap_port"] == 8998, name
