"""Per-class (short, long, all) and per-phase statistics of a run.

Definitions (what `markdown` and `compare_markdown` print):
- sent: requests of the class that were sent; ok: HTTP 200 and no error; failed = sent - ok,
  counted by status in `errors` ("0" = no response: connection error or timeout before headers;
  "200" = the stream reported an error or was cut).
- TTFT, E2E percentiles: over ok requests (numpy's linear interpolation between order
  statistics); ITL percentiles: over the ok requests' *mean* inter-token gaps.
- SLO attainment: share of ALL sent requests of the class whose TTFT <= the class's SLO;
  failed requests count as misses. `slo` maps "short"/"long" (and optionally "all", the default
  for a class without its own) to seconds; the "all" row checks each request against its own
  class's SLO.
- throughput: ok requests/s and received output tokens/s over the duration (the run's
  `meta["duration_s"]`, or a phase's window from `meta["phases"]`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from laps_agent.lab.results.records import CLASSES, RequestTable, RunResult

ROWS = (*CLASSES, "all")


@dataclass
class ClassStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)   # status -> failed requests
    ttft_p50: float | None = None
    ttft_p90: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p90: float | None = None
    e2e_p50: float | None = None
    e2e_p90: float | None = None
    slo_s: float | None = None
    slo_attainment: float | None = None
    req_per_s: float = 0.0
    tokens_per_s: float = 0.0


@dataclass
class Summary:
    label: str
    duration_s: float
    classes: dict[str, ClassStats]                              # "short", "long", "all"
    phases: dict[str, dict[str, ClassStats]] = field(default_factory=dict)
    slo: dict[str, float] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _pcts(values: np.ndarray, qs: tuple[float, ...]) -> list[float | None]:
    values = values[~np.isnan(values)]
    if not values.size:
        return [None] * len(qs)
    return [float(v) for v in np.percentile(values, qs)]


class _Columns:
    """The masks every row needs, computed once (a simulator summarises a million records)."""

    def __init__(self, t: RequestTable, slo: dict[str, float]):
        self.t, self.slo = t, slo
        self.ok = t.ok
        self.cls = {c: t.cls == c for c in CLASSES}
        self.ttft_or_inf = np.nan_to_num(t.ttft_s, nan=np.inf)
        self.limits = np.full(len(t), np.nan)  # each request's TTFT limit (NaN: none for its class)
        for c in CLASSES:
            limit = slo.get(c, slo.get("all"))
            if limit is not None:
                self.limits[self.cls[c]] = float(limit)


def _stats(c: _Columns, mask: np.ndarray, duration: float, row: str) -> ClassStats:
    t = c.t
    ok = c.ok & mask
    failed = mask & ~c.ok
    s = ClassStats(sent=int(mask.sum()), ok=int(ok.sum()), failed=int(failed.sum()))
    if s.failed:
        statuses, counts = np.unique(t.status[failed], return_counts=True)
        s.errors = {str(int(k)): int(v) for k, v in zip(statuses, counts)}
    s.ttft_p50, s.ttft_p90, s.ttft_p99 = _pcts(t.ttft_s[ok], (50, 90, 99))
    s.itl_p50, s.itl_p90 = _pcts(t.itl_mean_s[ok], (50, 90))
    s.e2e_p50, s.e2e_p90 = _pcts(t.e2e_s[ok], (50, 90))
    if duration > 0:
        s.req_per_s = s.ok / duration
        s.tokens_per_s = float(t.tokens[ok].sum()) / duration
    if c.slo and s.sent:
        if row == "all":
            if not np.isnan(c.limits[mask]).any():  # every class in the row has an SLO
                s.slo_attainment = float((ok & (c.ttft_or_inf <= c.limits)).sum()) / s.sent
        else:
            s.slo_s = c.slo.get(row, c.slo.get("all"))
            if s.slo_s is not None:
                s.slo_attainment = float((ok & (c.ttft_or_inf <= s.slo_s)).sum()) / s.sent
    return s


def _by_class(c: _Columns, base: np.ndarray, duration: float) -> dict[str, ClassStats]:
    return {row: _stats(c, base if row == "all" else base & c.cls[row], duration, row) for row in ROWS}


def _duration(result: RunResult) -> float:
    duration = result.meta.get("duration_s")
    if duration:
        return float(duration)
    t = result.records
    if not len(t):
        return 0.0
    ends = t.sent_s + np.nan_to_num(t.e2e_s, nan=0.0)
    return float(ends.max())


def summarize(result: RunResult, slo: dict[str, float] | None = None, by_phase: bool = False) -> Summary:
    t = result.records
    slo = {k: float(v) for k, v in (slo or {}).items()}
    duration = _duration(result)
    columns = _Columns(t, slo)
    meta = {k: result.meta.get(k) for k in ("workload", "target", "tool", "seed", "threshold", "rate_scale",
                                            "interrupted", "planned_requests", "sent_requests")
            if k in result.meta}
    if isinstance(meta.get("workload"), dict):  # {"name", "spec"} form
        meta["workload"] = meta["workload"].get("name")
    summary = Summary(result.label, duration, _by_class(columns, np.ones(len(t), dtype=bool), duration),
                      slo=slo, meta=meta)
    if by_phase:
        windows = {w.get("name"): w for w in result.meta.get("phases") or []}
        names = list(windows) or list(dict.fromkeys(t.phase.tolist()))
        for name in names:
            mask = t.phase == name
            window = windows.get(name)
            if window and window.get("end_s") is not None:
                span = float(window["end_s"]) - float(window.get("start_s") or 0.0)
            else:
                sent = t.sent_s[mask]
                span = float(sent.max() - sent.min()) if sent.size > 1 else 0.0
            summary.phases[name] = _by_class(columns, mask, span)
    return summary
