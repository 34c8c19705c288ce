#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one command (for the `device` tool's machines, or any GPU
# host): the gpu-marked tests, then `laps bench engine` in bf16 on a SmolLM2-135M-shaped model
# with random weights (scripts/smollm2_shaped.py says why not the real ones).
# Needs a python3 with torch (CUDA), tokenizers, safetensors, jinja2, numpy, httpx, pytest,
# pytest-timeout and hypothesis, as the device image has, not the project's virtualenv; the rest
# the engine imports comes as wheels in .whl/ (scripts/gpu_wheels.sh fetches them here), installed
# into a scratch folder first.
# usage: scripts/gpu_checks.sh [OUT_DIR]      (default: $OUT, else /tmp/laps-gpu-checks)
# e.g. through the device tool: scripts/gpu_wheels.sh here, then
#      run(command="bash scripts/gpu_checks.sh", carry=[".whl"])
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/laps-gpu-checks}}
mkdir -p "$out"
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
device=${LAPS_GPU_CHECKS_DEVICE:-cuda}   # cpu: try the script itself on a machine without one

python3 - <<'PY' 2>&1 | tee "$out/device.txt"
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY

# Only the files that hold gpu-marked tests, with only the fixtures they use: the suite's
# conftest loads every fixture module, and some import what that image lacks (kmock, httptools).
files=$(grep -rl "pytest.mark.gpu" tests --include="test_*.py" | sort)
python3 -m pytest -q -p no:cacheprovider -o addopts= -W ignore::pytest.PytestConfigWarning \
    --noconftest -p tests.support.fixtures_models -m gpu -rA $files 2>&1 | tee "$out/gpu-tests.txt"
tests_rc=${PIPESTATUS[0]}

model="$out/smollm2-135m-shaped"
python3 -m scripts.smollm2_shaped "$model" >/dev/null
python3 -m laps_agent.cli bench engine --model "$model" --device "$device" --dtype bfloat16 \
    2>&1 | tee "$out/bench-engine.txt"
bench_rc=${PIPESTATUS[0]}
rm -rf "$model"   # 0.5 GB: not something to bring back
echo "gpu tests rc=$tests_rc, bench rc=$bench_rc"
exit $(( tests_rc || bench_rc ))
