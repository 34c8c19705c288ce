"""Shared test set-up. Fixture modules live in tests/support/fixtures_*.py and are loaded here as
plugins, so each part of the suite adds its own without editing this file."""
from __future__ import annotations

import pathlib
import sys

_SUPPORT = pathlib.Path(__file__).parent / "support"
sys.path.insert(0, str(_SUPPORT.parent.parent))  # repo root, so `tests.support` imports work

pytest_plugins = sorted(f"tests.support.{p.stem}" for p in _SUPPORT.glob("fixtures_*.py"))


# Each directory under tests/ is a tier, and a marker of the same name selects it
# (`pytest -m unit`, `-m "not sglang"`): unit starts no process and no server (tests/unit/conftest.py
# enforces it), integration runs real servers on loopback, e2e whole stacks, sglang real SGLang,
# cluster a real Kubernetes control plane built from Go modules (tests/cluster/README.md).
TIERS = ("unit", "integration", "e2e", "sglang", "cluster")


def pytest_collection_modifyitems(items):
    tests_dir = pathlib.Path(__file__).parent
    for item in items:
        tier = item.path.relative_to(tests_dir).parts[0]
        if tier in TIERS:
            item.add_marker(tier)
        # Real SGLang on CPU sizes its KV cache from the machine's free memory (the `alone`
        # marker: pyproject.toml).
        if tier == "sglang":
            item.add_marker("alone")
