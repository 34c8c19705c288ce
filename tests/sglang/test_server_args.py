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
    from laps_operator.render.engine_args import sglang_engine_command
    from laps_operator.spec.cluster import parse_spec

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


SPELLINGS = """
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()  # as prepare_server_args builds it: abbreviations taken
ServerArgs.add_cli_args(parser)

def parsed(argv):
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return vars(parser.parse_args(["--model-path", "m", *argv]))
        except SystemExit:  # unknown or ambiguous
            return None

out = []
for dest, spellings in json.loads(sys.argv[1] if len(sys.argv) > 1 else CASES).items():
    switch = dest == "enable_dp_attention"
    for full, shortest in spellings.items():
        for n in range(len(shortest) - 1, len(full) + 1):
            ns = parsed([full[:n]] if switch else [full[:n], "3"])
            out.append([dest, shortest, full[:n], None if ns is None else ns.get(dest)])
print("RESULT" + json.dumps(out))
"""


def test_the_operators_gpu_flag_spellings_are_sglangs():
    """gpus.py reads the options that multiply a pod's GPUs under every spelling SGLang's parser
    takes (`--dp 2` is `--dp-size 2`): each listed spelling, and every longer prefix of its
    option, sets that dest; one character shorter no longer does (another option's, ambiguous
    or unknown), so none is missing either."""
    from laps_operator.spec.gpus import SGLANG_SPELLINGS

    require_sglang()
    done = run_in_sglang_venv(SPELLINGS.replace("CASES", repr(json.dumps(SGLANG_SPELLINGS))))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    for dest, shortest, spelling, value in json.loads(lines[-1][len("RESULT"):]):
        taken = value == (True if dest == "enable_dp_attention" else 3)
        assert taken is (len(spelling) >= len(shortest)), (dest, spelling, value)
