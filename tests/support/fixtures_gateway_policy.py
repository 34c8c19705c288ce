"""Fixtures of the gateway's pure policies: the SmolLM2 tokenizer alone (no model weights, ~4 s
once per session), for tests that count tokens."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from laps_agent.modelio.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_path)
