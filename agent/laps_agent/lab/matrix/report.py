"""The matrix report: per cell, each system's figures and their ratios to the first system's.

Per class (short, long; by the workload's threshold) of a cell's run:
- TTFT p50 and p90 over *all* sent requests, a refused or failed one counting as an infinite
  latency (so shedding cannot buy a better percentile): `inf` once more than 10% (p90) or 50%
  (p50) of the class is lost;
- SLO attainment: the share of sent requests answered within the class's SLO (a refused request
  is a miss);
- goodput: requests answered within their SLO per second of the run (also over all classes).
Ratios are to the baseline (the first system): 1.0 for the baseline itself, and for two infinite
or two zero figures. A system *loses* a cell when its attainment is more than one point
(LOSS_POINTS) below the baseline's in some class, and *wins* it when it is more than one point
above in some class without losing the other; its worst cell is the one with the largest
attainment loss in any class. Classes with no request in a cell are left out of it.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from laps_agent.lab.results.records import RunResult

CLASSES = ("short", "long")
LOSS_POINTS = 0.01
_FIGURES = ("ttft_p50", "ttft_p90", "attainment", "goodput")


def _quantile(values: np.ndarray, q: float) -> float | None:
    if not len(values):
        return None
    # No interpolation: an order statistic, so inf stays inf (numpy gives nan between inf and inf).
    return float(np.quantile(values, q, method="inverted_cdf"))


def cell_metrics(result: RunResult, slo: dict[str, float]) -> dict:
    """{class: {sent, failed, ttft_p50, ttft_p90, attainment, goodput}, "all": {...}} of one run."""
    cols = result.records.columns
    ok = (cols["status"] == 200) & np.array([e is None for e in cols["error"]], dtype=bool)
    ttft = np.where(ok, cols["ttft_s"].astype(float), np.inf)
    ttft = np.where(np.isnan(ttft), np.inf, ttft)
    cls = cols["cls"].astype(str)
    duration = float(result.meta.get("duration_s") or 0.0)
    limits = np.array([slo.get(c, slo.get("all", np.inf)) for c in cls], dtype=float)
    within = ttft <= limits
    out: dict = {}
    for name, mask in [(c, cls == c) for c in CLASSES] + [("all", np.ones(len(cls), dtype=bool))]:
        sent = int(mask.sum())
        good = int((within & mask).sum())
        out[name] = {"sent": sent, "failed": int((~ok & mask).sum()),
                     "ttft_p50": _quantile(ttft[mask], 0.5), "ttft_p90": _quantile(ttft[mask], 0.9),
                     "attainment": good / sent if sent else None,
                     "goodput": good / duration if duration > 0 else None}
    return out


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None:
        return None
    if value == base:  # also inf/inf and 0/0
        return 1.0
    if base == 0:
        return math.inf
    if math.isinf(base):
        return 0.0
    return value / base


def with_ratios(cell: dict, systems: list[str]) -> dict:
    """Adds `ratio` (each figure / the first system's) to every system's metrics of a cell."""
    base = cell["systems"][systems[0]]
    for name in systems:
        m = cell["systems"][name]
        m["ratio"] = {row: {f: (1.0 if name == systems[0] and m[row][f] is not None else ratio(m[row][f], base[row][f]))
                            for f in _FIGURES} for row in (*CLASSES, "all")}
        m["delta_points"] = {c: (None if m[c]["attainment"] is None or base[c]["attainment"] is None
                                 else 100 * (m[c]["attainment"] - base[c]["attainment"])) for c in CLASSES}
    return cell


def verdict(deltas: dict[str, float | None]) -> str:
    """"lost", "won" or "tied" from a system's attainment deltas (points) in a cell."""
    values = [d for d in deltas.values() if d is not None]
    if any(d < -100 * LOSS_POINTS for d in values):
        return "lost"
    if any(d > 100 * LOSS_POINTS for d in values):
        return "won"
    return "tied"


def summarize(cells: list[dict], systems: list[str]) -> dict:
    """Per system (all but the baseline): cells lost, won, tied and its worst cell."""
    out = {}
    for name in systems[1:]:
        counts = {"lost": 0, "won": 0, "tied": 0}
        worst = None
        for cell in cells:
            deltas = cell["systems"][name]["delta_points"]
            counts[verdict(deltas)] += 1
            for c, d in deltas.items():
                if d is not None and (worst is None or d < worst["delta_points"]):
                    worst = {"cell": cell["label"], "class": c, "delta_points": d}
        out[name] = {**counts, "cells": len(cells), "worst": worst}
    return out


# The targets a system is held to against the baseline (issue "LAPS that never loses"), per cell.
SHORT_P90_LIMIT, LONG_P90_LIMIT = 1.02, 1.30     # TTFT p90 ratios to the baseline, at most
MIXED_BELOW = 0.90                               # a cell "mixes" where the baseline attains less in a class
MIXED_GOODPUT, MIXED_VIOLATIONS = 1.15, 0.72     # there: goodput at least, SLO violations at most (ratios)


def _violations(m: dict) -> int:
    return sum(round(m[c]["sent"] * (1 - m[c]["attainment"])) for c in CLASSES if m[c]["attainment"] is not None)


def targets(report: dict, system: str) -> list[dict]:
    """Each target `system` is held to, over the report's cells: {"target", "cells" (where it
    applies), "met", "misses" (labels with the figure)}. Against the baseline (the first
    system): attainment, TTFT p90 per class, requests shed; where lengths mix (the baseline
    below MIXED_BELOW in a class): goodput and violations. Against `reference` (goodput),
    `sglang-cache-aware` (goodput, multi-turn cells) and `laps-pooled` (attainment) when the
    report has them."""
    base = report["systems"][0]
    checks: dict[str, list[tuple[str, bool, str]]] = {}

    def check(name: str, label: str, ok: bool, figure: str) -> None:
        checks.setdefault(name, []).append((label, ok, figure))

    for cell in report["cells"]:
        label, runs = cell["label"], cell["systems"]
        m, b = runs[system], runs[base]
        for c in CLASSES:
            d = m["delta_points"][c]
            if d is not None:
                check(f"{c} attainment >= {base}'s - 1 point", label, d >= -100 * LOSS_POINTS, f"{d:+.1f}")
        for c, limit in (("short", SHORT_P90_LIMIT), ("long", LONG_P90_LIMIT)):
            r = m["ratio"][c]["ttft_p90"]
            if r is not None:
                check(f"{c} TTFT p90 <= {limit:g}x {base}'s", label, r <= limit, f"{_num(r)}x")
        check(f"sheds no more than {base}", label, m["all"]["failed"] <= b["all"]["failed"],
              f"{m['all']['failed']} vs {b['all']['failed']}")
        if any((b[c]["attainment"] or 1.0) < MIXED_BELOW for c in CLASSES):
            g = m["ratio"]["all"]["goodput"]
            v = ratio(_violations(m), _violations(b))
            check(f"where lengths mix: goodput >= {MIXED_GOODPUT:g}x {base}'s", label,
                  g is not None and g >= MIXED_GOODPUT, f"{_num(g)}x")
            check(f"where lengths mix: SLO violations <= {MIXED_VIOLATIONS:g}x {base}'s", label,
                  v is not None and v <= MIXED_VIOLATIONS, f"{_num(v)}x")
        for other, only_multi_turn in (("reference", False), ("sglang-cache-aware", True)):
            if other in runs and other != system and (cell.get("multi_turn") or not only_multi_turn):
                mine, theirs = m["all"]["goodput"] or 0.0, runs[other]["all"]["goodput"] or 0.0
                check(f"goodput >= {other}'s" + (" (multi-turn cells)" if only_multi_turn else ""), label,
                      mine >= theirs * (1 - LOSS_POINTS), f"{_num(ratio(mine, theirs))}x")
        if "laps-pooled" in runs and system != "laps-pooled":
            for c in CLASSES:
                mine, theirs = m[c]["attainment"], runs["laps-pooled"][c]["attainment"]
                if mine is not None and theirs is not None:
                    check(f"{c} attainment >= laps-pooled's - 1 point", label, mine >= theirs - LOSS_POINTS,
                          f"{100 * (mine - theirs):+.1f}")
    return [{"target": name, "cells": len(rows), "met": sum(ok for _, ok, _ in rows),
             "misses": [f"{label} ({figure})" for label, ok, figure in rows if not ok]}
            for name, rows in checks.items()]


def targets_markdown(rows: list[dict], system: str) -> str:
    lines = [f"| {system}: target | cells met | misses (first three) |", "|---|---:|---|"]
    for row in rows:
        lines.append(f"| {row['target']} | {row['met']}/{row['cells']} | {'; '.join(row['misses'][:3]) or '–'} |")
    return "\n".join(lines)


# HTTP against the simulator (`laps bench compare --matrix`): each system's TTFT p90 ratios to the
# baseline agree when they differ by at most this share.
AGREEMENT_SHARE = 0.15


def agreement(report: dict) -> dict:
    """Per cell run over HTTP that also holds the simulator's figures of the same plan (`sim`):
    for each system and class, TTFT p90 measured and simulated, their ratios to the baseline's,
    and `deviation` = measured ratio / simulated ratio - 1 (None for the baseline itself, whose
    ratio is 1 by definition; where a ratio is 0 or infinite, the system's own p90 measured /
    simulated - 1, `basis` "p90"); how many agree within AGREEMENT_SHARE, and the worst."""
    systems, rows = report["systems"], []
    for cell in report["cells"]:
        sim = cell.get("sim")
        if not sim:
            continue
        for name in systems:
            for c in CLASSES:
                http, simulated = cell["systems"][name], sim[name]
                r_http, r_sim = http["ratio"][c]["ttft_p90"], simulated["ratio"][c]["ttft_p90"]
                if r_http is None or r_sim is None:
                    continue
                p90_http, p90_sim = http[c]["ttft_p90"], simulated[c]["ttft_p90"]
                basis, deviation = None, None
                if name != systems[0]:
                    informative = all(0 < r < math.inf for r in (r_http, r_sim))
                    # Where the baseline's p90 is infinite (it lost more than 10%) every ratio is 0:
                    # the system's own p90 is compared instead.
                    basis = "ratio" if informative else "p90"
                    deviation = ratio(r_http, r_sim) - 1 if informative else ratio(p90_http, p90_sim) - 1
                rows.append({"cell": cell["label"], "system": name, "class": c, "p90_http": p90_http,
                             "p90_sim": p90_sim, "ratio_http": r_http, "ratio_sim": r_sim, "basis": basis,
                             "deviation": deviation})
    judged = [r for r in rows if r["deviation"] is not None]
    worst = max(judged, key=lambda r: abs(r["deviation"]), default=None)
    return {"within": AGREEMENT_SHARE, "rows": rows, "judged": len(judged),
            "met": sum(abs(r["deviation"]) <= AGREEMENT_SHARE for r in judged), "worst": worst}


def agreement_markdown(agreed: dict) -> str:
    lines = [f"## HTTP against the simulator: {agreed['met']}/{agreed['judged']} p90 ratios agree within "
             f"{agreed['within']:.0%}", "",
             "| cell | system | class | TTFT p90 HTTP (ms) | simulated | ratio HTTP | simulated | deviation |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in agreed["rows"]:
        dev = ("–" if r["deviation"] is None else f"{r['deviation']:+.1%}"
               + (" (of the p90s)" if r["basis"] == "p90" else ""))
        lines.append(f"| {r['cell']} | {r['system']} | {r['class']} | {_num(r['p90_http'], 1000)} | "
                     f"{_num(r['p90_sim'], 1000)} | {_num(r['ratio_http'])} | {_num(r['ratio_sim'])} | {dev} |")
    return "\n".join(lines)


def _num(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    if value is None:
        return "–"
    if math.isinf(value):
        return "inf"
    return f"{value * scale:.{digits}g}"


def _with_ratio(m: dict, row: str, figure: str, scale: float, baseline: bool) -> str:
    text = _num(m[row][figure], scale)
    r = m["ratio"][row][figure]
    return text if baseline or r is None else f"{text} ({_num(r, digits=3)}×)"


def cell_markdown(cell: dict, systems: list[str]) -> str:
    lines = [f"### {cell['label']}: {cell['requests']} requests at {cell['rate']:.1f} req/s "
             f"({cell['load']:.0%} of vanilla-pd's {cell['capacity']:.1f} req/s)", "",
             "| system | TTFT p50 short (ms) | p90 short | p50 long | p90 long | SLO short | SLO long "
             "| goodput (req/s) | Δ short, long (points) |",
             "|---|" + "---:|" * 8]
    for i, name in enumerate(systems):
        m = cell["systems"][name]
        base = i == 0
        d = m["delta_points"]
        lines.append("| " + " | ".join([
            name, _with_ratio(m, "short", "ttft_p50", 1000, base), _with_ratio(m, "short", "ttft_p90", 1000, base),
            _with_ratio(m, "long", "ttft_p50", 1000, base), _with_ratio(m, "long", "ttft_p90", 1000, base),
            _with_ratio(m, "short", "attainment", 100, base), _with_ratio(m, "long", "attainment", 100, base),
            _with_ratio(m, "all", "goodput", 1, base),
            "" if base else f"{_num(d['short'], digits=2)}, {_num(d['long'], digits=2)} {verdict(d)}"]) + " |")
    return "\n".join(lines)


def summary_markdown(summary: dict, baseline: str) -> str:
    lines = [f"| system vs {baseline} | cells lost | won | tied | worst cell (class: attainment points) |",
             "|---|---:|---:|---:|---|"]
    for name, s in summary.items():
        w = s["worst"]
        worst = ("–" if w is None else f"never below (closest: {w['cell']}, {w['class']} {w['delta_points']:+.1f})"
                 if w['delta_points'] >= 0 else f"{w['cell']} ({w['class']}: {w['delta_points']:+.1f})")
        lines.append(f"| {name} | {s['lost']} | {s['won']} | {s['tied']} | {worst} |")
    return "\n".join(lines)


def report_markdown(report: dict) -> str:
    systems = report["systems"]
    slo = ", ".join(f"{k} {v:g} s" for k, v in report["slo"].items())
    parts = [f"# matrix {report['name']}: {len(report['cells'])} cells, baseline {systems[0]}, TTFT SLO {slo}", "",
             "A refused request counts as an infinite TTFT and an SLO miss; ratios (×) are to the baseline; "
             "lost: attainment more than 1 point below the baseline's in a class; won: more than 1 point above "
             "in a class without losing the other.", "", "## summary", "",
             summary_markdown(report["summary"], systems[0]), ""]
    for name, rows in report.get("targets", {}).items():
        parts += [targets_markdown(rows, name), ""]
    if "agreement" in report:
        parts += [agreement_markdown(report["agreement"]), ""]
    parts += ["## cells", ""]
    parts += [cell_markdown(cell, systems) + "\n" for cell in report["cells"]]
    return "\n".join(parts)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else None)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def heatmap(report: dict, path: Path) -> Path:
    """SLO attainment change against the baseline (points) per cell (rows) and system x class
    (columns): red where the system lost attainment, green where it gained."""
    systems = report["systems"][1:]
    cells = report["cells"]
    columns = [(name, c) for name in systems for c in CLASSES]
    data = np.full((len(cells), max(1, len(columns))), np.nan)
    for i, cell in enumerate(cells):
        for j, (name, c) in enumerate(columns):
            d = cell["systems"][name]["delta_points"][c]
            if d is not None:
                data[i, j] = d
    fig = Figure(figsize=(3.0 + 0.9 * max(1, len(columns)), 1.5 + 0.2 * len(cells)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    finite = data[np.isfinite(data)]
    limit = max(5.0, float(np.abs(finite).max())) if finite.size else 5.0
    image = ax.imshow(data, aspect="auto", cmap="RdYlGn", vmin=-limit, vmax=limit, interpolation="nearest")
    ax.set_xticks(range(len(columns)), [f"{name}\n{c}" for name, c in columns], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(cells)), [c["label"] for c in cells], fontsize=7)
    for i in range(data.shape[0]):
        for j in range(len(columns)):
            if np.isfinite(data[i, j]):
                ax.text(j, i, f"{data[i, j]:+.0f}", ha="center", va="center", fontsize=6)
    ax.set_title(f"SLO attainment vs {report['systems'][0]} (points)")
    fig.colorbar(image, ax=ax, shrink=0.3)
    fig.savefig(path, dpi=100, format="png")
    return path


def save_report(report: dict, out: Path, plots: bool = True) -> dict[str, Path]:
    """matrix.json, matrix.md and (plots) matrix-heatmap.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "matrix.json", "markdown": out / "matrix.md"}
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_json_safe(report), indent=1) + "\n")
    os.replace(tmp, paths["json"])
    paths["markdown"].write_text(report_markdown(report) + "\n")
    if plots and report["cells"]:
        paths["heatmap"] = heatmap(report, out / "matrix-heatmap.png")
    return paths
