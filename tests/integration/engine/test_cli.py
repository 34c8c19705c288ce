from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def run_engine(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laps_agent.cli", "engine", *args],
                          capture_output=True, text=True, timeout=120)


def test_missing_model_is_a_clear_error_not_a_traceback(tmp_path):
    result = run_engine("--model", str(tmp_path / "missing.gguf"), "--port", "1")
    assert result.returncode == 2
    assert "laps engine: error:" in result.stderr and "no such file" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_flag_values_are_refused(tiny_engine_model):
    result = run_engine("--model", str(tiny_engine_model), "--wait-max-batch", "0", "--port", "1")
    assert result.returncode == 2 and "wait_max_batch" in result.stderr
    result = run_engine("--model", str(tiny_engine_model), "--batch-prefill-graphs-seq-lengths", "16,x")
    assert result.returncode == 2 and "comma-separated integers" in result.stderr


@pytest.mark.parametrize("flag, value, message", [
    ("--max-running-requests", "0", "--max-running-requests must be >= 1, got 0"),
    ("--max-prefill-tokens", "0", "--max-prefill-tokens must be >= 1, got 0"),
    ("--max-queued-requests", "-1", "--max-queued-requests must be >= 0 (0: no bound), got -1"),
    ("--context-length", "0", "--context-length must be >= 1, got 0"),
    ("--torch-threads", "-1", "--torch-threads must be >= 1, got -1"),
    ("--decode-graph-max-context", "0", "--decode-graph-max-context must be >= 1, got 0"),
    ("--mem-fraction", "1.5", "--mem-fraction must be in (0, 1], got 1.5"),
    ("--port", "70000", "cannot listen on 0.0.0.0:70000: the port must be 0-65535"),
])
def test_values_the_engine_cannot_run_with_are_refused_before_loading(tiny_engine_model, flag, value, message):
    """They were read as the default (0 running requests), as 'no bound' (a negative queue),
    a traceback (threads, port) or an engine that exits 0 having served nothing (port)."""
    result = run_engine("--model", str(tiny_engine_model), "--port", "0", flag, value)
    assert result.returncode == 2
    assert f"laps engine: error: {message}" in result.stderr and "Traceback" not in result.stderr
    assert "loading model" not in result.stderr


def test_a_port_in_use_is_said_before_loading(tiny_engine_model):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for args in (("--port", str(port)), ("--role", "prefill", "--port", "0", "--bootstrap-port", str(port))):
            result = run_engine("--model", str(tiny_engine_model), "--host", "127.0.0.1", *args)
            assert result.returncode == 2
            assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
            assert "loading model" not in result.stderr and "Traceback" not in result.stderr


def test_an_engine_serves_in_bfloat16(engine_launcher, tiny_engine_model):
    import httpx

    engine = engine_launcher(tiny_engine_model, "mixed", ("--dtype", "bfloat16", "--kv-pages", "64"))
    assert "(bfloat16)" in engine.log_tail()  # what it loaded, in its start-up line
    reply = httpx.post(engine.url + "/generate", json={
        "input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}, timeout=60)
    assert reply.status_code == 200 and len(reply.json()["output_ids"]) == 4


def run_bench_engine(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laps_agent.cli", "bench", "engine", *args],
                          capture_output=True, text=True, timeout=300)


def test_bench_engine_prints_its_numbers_next_to_their_targets(tiny_engine_model):
    """The benchmark the GPU checks run (scripts/gpu_checks.sh), here on CPU and a tiny model:
    it runs to the end and prints every figure with its target."""
    result = run_bench_engine("--model", str(tiny_engine_model), "--long-tokens", "300",
                              "--short-count", "4", "--repeats", "1", "--torch-threads", "1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for row in ("short  FIFO", "short  LAPS", "long   LAPS-bucketed", "padding waste",
                "one by one (eager)", "batched, bucketed"):
        assert row in out
    assert "(target <= 0.2x)" in out and "(target >= 1.5x)" in out


def test_bench_engine_missing_model_is_a_clear_error(tmp_path):
    result = run_bench_engine("--model", str(tmp_path / "missing.gguf"))
    assert result.returncode == 2
    assert "laps bench engine: error:" in result.stderr and "no such file" in result.stderr
    assert "Traceback" not in result.stderr
