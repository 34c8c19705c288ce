"""Markdown tables of summaries: one run (`markdown`) and configurations side by side
(`compare_markdown`, the first configuration is the baseline; the others show ratios `0.42×`).
Times are printed in milliseconds."""
from __future__ import annotations

from typing import Callable

from laps_agent.lab.results.summary import ROWS, ClassStats, Summary
from laps_agent.policy.classes import CLASSES

_NO_RESPONSE = "0"


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    ms = value * 1000.0
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100.0 * value:.1f}%"


def _num(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"


def _errors(stats: ClassStats) -> str:
    parts = []
    for status, n in sorted(stats.errors.items(), key=lambda kv: int(kv[0])):
        name = "no response" if status == _NO_RESPONSE else ("stream error" if status == "200" else f"HTTP {status}")
        parts.append(f"{name} ×{n}")
    return ", ".join(parts)


def _table(classes: dict[str, ClassStats]) -> list[str]:
    lines = ["| class | sent | ok | failed | TTFT p50 (ms) | TTFT p90 | TTFT p99 | ITL p50 (ms) | ITL p90 "
             "| E2E p50 (ms) | E2E p90 | SLO attainment | req/s | output tok/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in ROWS:
        s = classes[row]
        slo = _pct(s.slo_attainment) + (f" (≤ {_ms(s.slo_s)} ms)" if s.slo_s is not None else "")
        lines.append(f"| {row} | {s.sent} | {s.ok} | {s.failed} | {_ms(s.ttft_p50)} | {_ms(s.ttft_p90)} "
                     f"| {_ms(s.ttft_p99)} | {_ms(s.itl_p50)} | {_ms(s.itl_p90)} | {_ms(s.e2e_p50)} "
                     f"| {_ms(s.e2e_p90)} | {slo} | {_num(s.req_per_s)} | {_num(s.tokens_per_s)} |")
    errors = [f"{row}: {_errors(classes[row])}" for row in ROWS[:-1] if classes[row].errors]
    if errors:
        lines += ["", "Failed requests by status — " + "; ".join(errors)]
    return lines


def markdown(summary: Summary) -> str:
    meta = summary.meta
    facts = [f"duration {summary.duration_s:.1f} s"]
    for key in ("workload", "target", "threshold", "seed", "rate_scale"):
        if meta.get(key) is not None:
            facts.append(f"{key} {meta[key]}")
    lines = [f"## {summary.label}", "", ", ".join(facts), ""]
    if meta.get("interrupted"):  # a partial run must not read as a complete one in results.md
        lines += [f"**Interrupted**: {meta.get('sent_requests', '?')} of {meta.get('planned_requests', '?')} "
                  "planned requests were sent; requests in flight were cut (error \"interrupted\").", ""]
    lines += _table(summary.classes)
    for name, classes in summary.phases.items():
        lines += ["", f"### phase {name}", ""] + _table(classes)
    return "\n".join(lines)


# metric title, value of a ClassStats, formatter
_METRICS: list[tuple[str, Callable[[ClassStats], float | None], Callable[[float | None], str]]] = [
    ("TTFT p50 (ms)", lambda s: s.ttft_p50, _ms),
    ("TTFT p90 (ms)", lambda s: s.ttft_p90, _ms),
    ("TTFT p99 (ms)", lambda s: s.ttft_p99, _ms),
    ("E2E p50 (ms)", lambda s: s.e2e_p50, _ms),
    ("E2E p90 (ms)", lambda s: s.e2e_p90, _ms),
    ("ITL p50 (ms)", lambda s: s.itl_p50, _ms),
    ("ITL p90 (ms)", lambda s: s.itl_p90, _ms),
    ("SLO attainment", lambda s: s.slo_attainment, _pct),
    ("throughput (ok req/s)", lambda s: s.req_per_s, _num),
    ("output tokens/s", lambda s: s.tokens_per_s, _num),
    ("failed requests", lambda s: s.failed, lambda v: "–" if v is None else str(int(v))),
]


def ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base == 0:
        return ""
    return f" ({value / base:.2f}×)"


def compare_markdown(labelled: list[tuple[str, Summary]]) -> str:
    """One table per metric: a row per configuration, a column per class; every configuration
    after the first shows its ratio to the first (the baseline)."""
    if not labelled:
        return ""
    base_label = labelled[0][0]
    lines = [f"Baseline: **{base_label}**; other rows show value (ratio to the baseline)."]
    for title, get, fmt in _METRICS:
        values = [[get(summary.classes[row]) for row in ROWS] for _, summary in labelled]
        if all(v is None for row in values for v in row):
            continue
        lines += ["", f"### {title}", "", "| configuration | " + " | ".join(ROWS) + " |",
                  "|---|" + "---:|" * len(ROWS)]
        for i, (label, _) in enumerate(labelled):
            cells = [fmt(v) + (ratio(v, values[0][j]) if i else "") for j, v in enumerate(values[i])]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def moves_by_phase(result) -> dict[str, int]:
    """Pod moves between the groups in each phase, counted from the run's timeline (changes of
    the short group's size between consecutive samples)."""
    windows = result.meta.get("phases") or []
    counts = {w["name"]: 0 for w in windows}
    for before, after in zip(result.timeline, result.timeline[1:]):
        if before.pods.get("short") != after.pods.get("short"):
            name = next((w["name"] for w in windows if w["start_s"] <= after.t < w["end_s"]), None)
            if name is not None:
                counts[name] += abs(after.pods.get("short", 0) - before.pods.get("short", 0))
    return counts


def phases_markdown(labelled: list[tuple[str, Summary, dict[str, int] | None]]) -> str:
    """Per phase, a row per configuration: p90 TTFT per class (ratio to the first configuration),
    SLO attainment per class, failed requests and pod moves (when known)."""
    if not labelled or not labelled[0][1].phases:
        return ""
    lines = []
    for phase in labelled[0][1].phases:
        lines += ["", f"### phase {phase}", "",
                  "| configuration | short TTFT p90 (ms) | long TTFT p90 (ms) | short SLO | long SLO | failed | moves |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        base = labelled[0][1].phases[phase]
        for i, (label, summary, moves) in enumerate(labelled):
            stats = summary.phases.get(phase)
            if stats is None:
                continue
            cells = []
            for cls in CLASSES:
                v = stats[cls].ttft_p90
                cells.append(_ms(v) + (ratio(v, base[cls].ttft_p90) if i else ""))
            slo = [_pct(stats[cls].slo_attainment) for cls in CLASSES]
            moved = "–" if moves is None else str(moves.get(phase, 0))
            lines.append(f"| {label} | {cells[0]} | {cells[1]} | {slo[0]} | {slo[1]} | {stats['all'].failed} | {moved} |")
    return "\n".join(lines).lstrip("\n")
