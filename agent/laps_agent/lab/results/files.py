"""Result files: `results.json` (column-wise), `results.md` and the plots.

results.json = {"format": 1, "meta": {...}, "requests": {"index": [...], "ttft_s": [...], ...},
"timeline": {"t": [...], "pods": {"short": [...], "long": [...]}, "pending_tokens": {...},
"pending_requests": {...}}}. Times are rounded to microseconds; a missing value is null. One
list per column keeps a million records at a few tens of MB and a few seconds to write.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from laps_agent.lab.results.records import CLASSES, COLUMNS, RequestTable, RunResult, TimelineSample
from laps_agent.lab.results.report import markdown
from laps_agent.lab.results.summary import summarize

FORMAT = 1
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"


def _column_to_json(kind: str, values: np.ndarray) -> list:
    if kind == "f":
        rounded = np.round(values, 6)
        out = rounded.tolist()
        if np.isnan(rounded).any():
            out = [None if v != v else v for v in out]
        return out
    if kind == "oi":
        out = values.tolist()
        return [None if v < 0 else v for v in out] if (values < 0).any() else out
    return values.tolist()


def _column_from_json(kind: str, values: list) -> np.ndarray:
    if kind == "i":
        return np.asarray(values, dtype=np.int64)
    if kind == "oi":
        return np.array([-1 if v is None else v for v in values], dtype=np.int64)
    if kind == "f":
        return np.array(values, dtype=np.float64)  # null -> NaN
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _timeline_to_json(timeline: list[TimelineSample]) -> dict:
    groups = sorted({g for s in timeline for g in s.pods} | set(CLASSES))
    return {"t": [round(s.t, 6) for s in timeline],
            **{key: {g: [getattr(s, key).get(g, 0) for s in timeline] for g in groups}
               for key in ("pods", "pending_tokens", "pending_requests")}}


def _timeline_from_json(data: dict) -> list[TimelineSample]:
    out = []
    for i, t in enumerate(data.get("t") or []):
        sample = TimelineSample(float(t))
        for key in ("pods", "pending_tokens", "pending_requests"):
            getattr(sample, key).update({g: int(v[i]) for g, v in (data.get(key) or {}).items()})
        out.append(sample)
    return out


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def to_json(result: RunResult) -> str:
    columns = result.records.columns
    doc = {"format": FORMAT, "meta": _json_safe(result.meta),
           "requests": {name: _column_to_json(kind, columns[name]) for name, kind in COLUMNS.items()},
           "timeline": _timeline_to_json(result.timeline)}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


def load_result(path: str | Path) -> RunResult:
    """A saved result: the directory `save` wrote, or its results.json."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_JSON
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or "requests" not in doc:
        raise ValueError(f"{path}: not a laps results file")
    requests = doc["requests"]
    columns = {name: _column_from_json(kind, requests[name]) for name, kind in COLUMNS.items() if name in requests}
    try:
        table = RequestTable.from_columns(**columns)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{path}: bad requests columns: {exc}") from None
    return RunResult(doc.get("meta") or {}, table, _timeline_from_json(doc.get("timeline") or {}))


def save(result: RunResult, out_dir: str | Path, *, slo: dict[str, float] | None = None,
         plots: bool = True) -> dict[str, Path]:
    """Write results.json, results.md and the plots (ttft_cdf.png, ttft_timeline.png, and
    groups_timeline.png when there is a timeline) into `out_dir`; returns them by name."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / RESULTS_JSON, "markdown": out / RESULTS_MD}
    # Written beside and renamed into place: a run stopped while writing (a second Ctrl-C, a
    # full disk) leaves the previous file or none, never a cut JSON that load_result chokes on.
    partial = paths["json"].with_name(RESULTS_JSON + ".partial")
    try:
        partial.write_text(to_json(result))
        partial.replace(paths["json"])
    finally:
        partial.unlink(missing_ok=True)
    slo = slo if slo is not None else result.meta.get("slo")
    summary = summarize(result, slo=slo, by_phase=len(result.meta.get("phases") or []) > 1)
    paths["markdown"].write_text(markdown(summary) + "\n")
    if plots:
        # lazy: matplotlib loads only when plots are drawn
        from laps_agent.lab.results.plots import write_plots

        paths.update(write_plots(result, out))
    return paths
