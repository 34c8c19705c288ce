#!/usr/bin/env bash
# Wheels for the packages that the GPU machines' image lacks and the engine imports (pydantic's
# JSON parser, the HTTP server stack, gguf), at the versions of this project's .venv, fetched
# here into .whl/ (git-ignored) for scripts/gpu_checks.sh to install there, where nothing can be
# downloaded. The image's python is CPython 3.12 on x86-64.
# usage: scripts/gpu_wheels.sh    then: run(command="bash scripts/gpu_checks.sh", carry=[".whl"])
set -euo pipefail
cd "$(dirname "$0")/.."
names="pydantic pydantic-core annotated-types typing-inspection fastapi starlette opentelemetry-api uvicorn httptools gguf"
pins=$(.venv/bin/python -m pip freeze | tr _ - | grep -iE "^($(echo "$names" | tr ' ' '|'))==") \
    || { echo "gpu_wheels: none of $names in .venv (run scripts/setup.sh first)" >&2; exit 1; }
rm -rf .whl && mkdir .whl
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms="$platforms --platform $p"
done
# shellcheck disable=SC2086  # word splitting of the pins and platforms is meant
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $platforms -d .whl $pins
ls .whl
