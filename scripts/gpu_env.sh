# Sourced by scripts/gpu_checks.sh and scripts/gpu_local.sh: the environment both run in on a
# GPU machine whose python3 holds torch (CUDA) but not the whole project: the sources on
# PYTHONPATH, and the wheels of .whl/ (scripts/gpu_wheels.sh fetches them) in a scratch folder.
export PYTHONPATH="$PWD/agent:$PWD/operator:$PWD" PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    gpu_site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$gpu_site" .whl/*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:$gpu_site"
fi
