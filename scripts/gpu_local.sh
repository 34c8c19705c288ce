#!/usr/bin/env bash
# `laps local --device cuda` on a GPU machine, used as a user would: 2 prefill + 1 decode builtin
# engines (bf16, CUDA graphs captured at start-up, KV handed over between CUDA engines) behind
# the gateway, a SmolLM2-135M-shaped model with random weights (scripts/smollm2_shaped.py says
# why), then scripts/gpu_smoke.py's checks and a short `laps bench run` through the gateway.
# usage: scripts/gpu_local.sh [OUT_DIR]     e.g. run(command="bash scripts/gpu_local.sh", carry=[".whl"])
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/laps-gpu-local}}
mkdir -p "$out"
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
model=$(mktemp -d)/smollm2-135m-shaped
python3 -m scripts.smollm2_shaped "$model" >/dev/null || exit 1
work=$(mktemp -d)
python3 -m laps_agent.cli local --device "${LAPS_GPU_CHECKS_DEVICE:-cuda}" --model "$model" --port 8000 --workdir "$work" \
    >"$out/local.txt" 2>&1 &
local_pid=$!
stop_local() {  # SIGTERM, as Kubernetes stops it (a background job here ignores SIGINT); bounded
    kill -TERM $local_pid 2>/dev/null
    timeout 60 tail --pid=$local_pid -f /dev/null || kill -KILL $local_pid 2>/dev/null
    tail -n 60 "$work"/*.log >"$out/engine-logs.txt" 2>&1
    grep -hE -A3 "ERROR|Traceback" "$work"/*.log 2>/dev/null | head -200 >"$out/engine-errors.txt"
}
trap stop_local EXIT
ready=0
for _ in $(seq 600); do   # up to 5 minutes: engines load and capture their graphs
    grep -q "OpenAI-compatible API" "$out/local.txt" && { ready=1; break; }
    kill -0 $local_pid 2>/dev/null || { echo "laps local exited"; cat "$out/local.txt"; exit 1; }
    sleep 0.5
done
cat "$out/local.txt"
[ $ready = 1 ] || { echo "laps local was not serving after 5 minutes"; exit 1; }
python3 -m scripts.gpu_smoke http://127.0.0.1:8000 2>&1 | tee "$out/smoke.txt"
smoke_rc=${PIPESTATUS[0]}
# Each run's `laps bench run` flags, '|' between runs (e.g. a heavier load, or multi-turn-chat
# for the prefix cache): LAPS_GPU_BENCH="--workload lmsys-steady --rate-scale 8|--workload multi-turn-chat"
IFS='|' read -ra runs <<<"${LAPS_GPU_BENCH:---workload lmsys-steady --max-requests 300}"
bench_rc=0
: >"$out/bench-run.txt"
for i in "${!runs[@]}"; do
    # shellcheck disable=SC2086  # one run's flags, split as written
    python3 -m laps_agent.cli bench run http://127.0.0.1:8000 ${runs[$i]} --tokenizer "$model" \
        --no-progress --out "$work/bench-$i" 2>&1 | tee -a "$out/bench-run.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || bench_rc=1
done
echo "smoke rc=$smoke_rc, bench rc=$bench_rc"
exit $(( smoke_rc || bench_rc ))
