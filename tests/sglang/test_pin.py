"""The SGLang version is pinned once, in pyproject.toml's `sglang` extra; everything else that
names it must agree (no SGLang needed for this check)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def pinned() -> str:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sglang"]
    (req,) = [r for r in extra if r.startswith("sglang==")]
    return req.removeprefix("sglang==")


def test_plugin_dockerfile_and_setup_script_agree_with_the_pin():
    from laps_agent.sglang_plugin.compat import PINNED

    version = pinned()
    assert PINNED == version
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(rf"^ARG SGLANG_VERSION={re.escape(version)}$", dockerfile, re.M), \
        "Dockerfile's ARG SGLANG_VERSION must equal pyproject's sglang pin"
    assert "lmsysorg/sglang:v${SGLANG_VERSION}" in dockerfile
    # The set-up script reads the pin from pyproject instead of repeating it.
    script = (REPO / "scripts" / "setup_sglang.sh").read_text()
    assert "sglang==" not in script.replace('startswith("sglang==")', "")


def test_the_plugin_entry_point_is_declared():
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["sglang.srt.plugins"]
    assert entry == {"laps": "laps_agent.sglang_plugin:register"}
