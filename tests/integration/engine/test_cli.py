from __future__ import annotations

import subprocess
import sys


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
