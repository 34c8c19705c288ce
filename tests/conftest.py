"""Shared test set-up. Fixture modules live in tests/support/fixtures_*.py and are loaded here as
plugins, so each part of the suite adds its own without editing this file."""
from __future__ import annotations

import pathlib
import sys

_SUPPORT = pathlib.Path(__file__).parent / "support"
sys.path.insert(0, str(_SUPPORT.parent.parent))  # repo root, so `tests.support` imports work

pytest_plugins = sorted(f"tests.support.{p.stem}" for p in _SUPPORT.glob("fixtures_*.py"))
