"""Model fixtures: a seeded tiny Llama-family HF directory, the SmolLM2 GGUF path, and one
session-wide SmolLM2 load for the tests that are about SmolLM2 (loading takes seconds)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# OpenMP worker threads spin while they wait for each other. On this shared 2-core machine other
# processes preempt them, and a 2-thread SmolLM2 prefill measured 8x slower than with passive
# waiting. libgomp reads this once, when torch is first imported: plugins load before any test
# module imports torch, and engine subprocesses started by tests inherit it. A default only.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", seed=0)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from laps_agent.engine.model.loader import ModelLoadError, default_model_path

    try:
        return default_model_path()
    except ModelLoadError as err:
        pytest.skip(f"SmolLM2 GGUF not available: {err}")


@pytest.fixture(scope="session")
def smollm2_loaded(smollm2_path: Path):
    """LoadedModel of SmolLM2 (fp32, CPU), shared by every test of the session. Treat as
    read-only: build your own ModelRunner (it owns the KV pool)."""
    from laps_agent.engine.model.loader import load_model

    return load_model(smollm2_path)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path):
    """LoadedModel of the tiny model, shared and read-only like smollm2_loaded."""
    from laps_agent.engine.model.loader import load_model

    return load_model(tiny_model_dir)
