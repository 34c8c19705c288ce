#!/usr/bin/env bash
# A client nobody here wrote: SGLang's own bench_serving against `laps local` on emulated engines
# (the H200 32B profile, 4 prefill + 2 decode), once as laps runs by default and once with
# --single-pool, and the TTFT figures of each (issue "LAPS that never loses": laps's p90 should be
# at most --single-pool's; its prompts: uniform 41-2,048 tokens, ~11% short). Needs `make test`'s set-up (.venv, .venv-sglang, .cache/smollm2-hf).
# Usage: scripts/bench_serving_check.sh [REQUESTS] [RATE]   (default 600 at 14 req/s: ~45 s each)
# LAPS_FLAGS: more `laps local` flags for the laps run; ONLY_LAPS=1: skip the --single-pool run.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-600}
rate=${2:-14}
out=$(mktemp -d)
run() {   # $1: label, $2...: laps local flags
  local label=$1; shift
  local port=18$((RANDOM % 900 + 100))
  .venv/bin/laps local --engine emulated --profile gpu-h200-qwen2.5-32b --prefill 4 --decode 2 \
    --port "$port" "$@" > "$out/$label-local.log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break; sleep 1; done
  .venv-sglang/bin/python -m sglang.bench_serving --backend sglang-oai --base-url "http://127.0.0.1:$port" \
    --dataset-name random-ids --random-input-len 2048 --random-range-ratio 0.02 --random-output-len 16 \
    --request-rate "$rate" --num-prompts "$requests" --tokenizer .cache/smollm2-hf --seed 1 \
    --output-file "$out/$label.jsonl" --output-details \
    > "$out/$label-bench.log" 2>&1 || { tail -20 "$out/$label-bench.log"; kill -INT "$pid"; exit 1; }
  kill -INT "$pid"; wait "$pid" || true
  echo "== $label"; grep -E "Successful requests|TTFT" "$out/$label-bench.log"
}
run laps ${LAPS_FLAGS:-}
[ -n "${ONLY_LAPS:-}" ] || run single-pool --single-pool
echo "logs: $out"
