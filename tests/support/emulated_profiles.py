"""Synthetic emulated-engine profiles for tests (the schema: laps_agent/emulated/profile.py).
One base of round numbers; each test states only the costs and limits its story depends on."""
from __future__ import annotations

import copy
from typing import Any

_BASE: dict[str, Any] = {
    "provenance": "synthetic",
    "model": {"kv_bytes_per_token": 1000},
    "engine": {"kv_capacity_tokens": 65536, "page_size": 16, "context_length": 8192,
               "max_running_requests": 64},
    "prefill": {"overhead_s": 0.005, "per_token_s": 0.0},
    "decode": {"overhead_s": 0.002},
    "transfer": {"bytes_per_s": 1.0e10},
}


def synthetic_profile(name: str, *, served: str | None = None, **sections: dict[str, Any]) -> dict[str, Any]:
    """A profile named `name` whose model is served as `served` (default: `name`); each keyword
    (model=, engine=, prefill=, decode=, transfer=) updates that section of the base."""
    profile = copy.deepcopy(_BASE)
    profile["name"] = name
    profile["model"]["name"] = served or name
    for section, values in sections.items():
        if section not in _BASE or section == "provenance":
            raise KeyError(f"no profile section {section!r}")
        profile[section].update(values)
    return profile
