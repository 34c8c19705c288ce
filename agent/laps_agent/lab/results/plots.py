"""PNG plots of a run, drawn off-screen (matplotlib's Agg canvas; no pyplot, so no global
backend is set and no display is needed). Every figure is FIGSIZE at DPI (900 x 500 pixels).

They stay fast with a million requests: CDFs are drawn from 1,000 quantiles, the TTFT timeline
from a deterministic subsample of at most `_MAX_POINTS` requests per class, plus binned p90 lines
computed on all of them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from laps_agent.lab.results.records import CLASSES, RunResult

FIGSIZE = (9.0, 5.0)
DPI = 100
_COLORS = {"short": "tab:blue", "long": "tab:orange", "all": "tab:gray"}
_MAX_POINTS = 20_000
_BINS = 60


def _figure(rows: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, format="png")
    return path


def _phase_lines(ax, result: RunResult, label: bool = True) -> None:
    windows = result.meta.get("phases") or []
    if len(windows) < 2:
        return
    for window in windows[1:]:
        ax.axvline(window["start_s"], color="black", lw=0.8, ls=":")
    if label:
        for window in windows:
            ax.text(window["start_s"], 0.01, f" {window['name']}", transform=ax.get_xaxis_transform(),
                    va="bottom", ha="left", fontsize=8, color="dimgray")


def _log_if_spread(ax, values: np.ndarray, axis: str) -> None:
    positive = values[values > 0]
    if positive.size and positive.max() / positive.min() > 20:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def ttft_cdf(result: RunResult, path: Path) -> Path:
    t = result.records
    ok = t.ok & ~np.isnan(t.ttft_s)
    fig, (ax,) = _figure()
    q = np.linspace(0.0, 1.0, 1001)
    drawn = []
    for cls in (*CLASSES, "all"):
        mask = ok if cls == "all" else ok & (t.cls == cls)
        values = t.ttft_s[mask]
        if not values.size:
            continue
        drawn.append(values)
        ax.plot(np.quantile(values, q), q, color=_COLORS[cls], ls="--" if cls == "all" else "-",
                label=f"{cls} (n={values.size})")
    if drawn:
        _log_if_spread(ax, np.concatenate(drawn), "x")
        ax.legend(loc="lower right")
    else:
        ax.text(0.5, 0.5, "no successful requests", transform=ax.transAxes, ha="center")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("share of successful requests")
    ax.set_ylim(0, 1.0)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"TTFT CDF — {result.label}")
    return _save(fig, path)


def _subsample(idx: np.ndarray, limit: int) -> np.ndarray:
    if idx.size <= limit:
        return idx
    return np.sort(np.random.default_rng(0).choice(idx, size=limit, replace=False))


def _binned_p90(x: np.ndarray, y: np.ndarray, end: float) -> tuple[np.ndarray, np.ndarray]:
    edges = np.linspace(0.0, end, _BINS + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, _BINS - 1)
    order = np.argsort(which, kind="stable")
    bins, starts = np.unique(which[order], return_index=True)
    groups = np.split(y[order], starts[1:])
    centres = (edges[bins] + edges[bins + 1]) / 2
    return centres, np.array([np.percentile(g, 90) for g in groups])


def ttft_timeline(result: RunResult, path: Path) -> Path:
    t = result.records
    ok = t.ok & ~np.isnan(t.ttft_s)
    fig, (ax,) = _figure()
    end = float(max(t.sent_s.max(initial=0.0), result.meta.get("duration_s") or 0.0)) or 1.0
    for cls in CLASSES:
        idx = np.flatnonzero(ok & (t.cls == cls))
        if not idx.size:
            continue
        pick = _subsample(idx, _MAX_POINTS)
        ax.scatter(t.sent_s[pick], t.ttft_s[pick], s=6, alpha=0.5, color=_COLORS[cls], lw=0,
                   label=f"{cls} (n={idx.size})", rasterized=True)
        x, p90 = _binned_p90(t.sent_s[idx], t.ttft_s[idx], end)
        ax.plot(x, p90, color=_COLORS[cls], lw=1.2, label=f"{cls} p90")
    failed = np.flatnonzero(~t.ok)
    if failed.size:  # along the top edge: a failure has no TTFT
        pick = _subsample(failed, _MAX_POINTS)
        ax.plot(t.sent_s[pick], np.full(pick.size, 0.98), "x", color="tab:red", ms=4,
                transform=ax.get_xaxis_transform(), label=f"failed (n={failed.size})")
    if ok.any():
        _log_if_spread(ax, t.ttft_s[ok], "y")
        fig.legend(loc="outside lower center", fontsize=8, ncols=5)
    _phase_lines(ax, result)
    ax.set_xlim(0, end)
    ax.set_xlabel("sent at (s since start)")
    ax.set_ylabel("time to first token (s)")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"TTFT over time — {result.label}")
    return _save(fig, path)


def groups_timeline(result: RunResult, path: Path) -> Path:
    samples = result.timeline
    x = np.array([s.t for s in samples])
    fig, (top, bottom) = _figure(rows=2)
    most = 1
    for cls in CLASSES:
        pods = [s.pods.get(cls, 0) for s in samples]
        most = max([most, *pods])
        # equal group sizes overlap: the long group dashed over a wider short line
        style = {"lw": 3.0} if cls == "short" else {"lw": 1.5, "ls": "--"}
        top.step(x, pods, where="post", color=_COLORS[cls], label=cls, **style)
        bottom.plot(x, [s.pending_tokens.get(cls, 0) for s in samples], color=_COLORS[cls],
                    label=f"{cls} tokens")
    top.set_ylim(0, most + 0.5)
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    twin = bottom.twinx()
    for cls in CLASSES:
        twin.plot(x, [s.pending_requests.get(cls, 0) for s in samples], color=_COLORS[cls], ls=":",
                  label=f"{cls} requests")
    top.set_ylabel("prefill pods")
    top.legend(loc="upper right", fontsize=8)
    bottom.set_ylabel("pending tokens")
    twin.set_ylabel("pending requests (dotted)")
    bottom.set_xlabel("time (s since start)")
    bottom.legend(loc="upper left", fontsize=8)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        _phase_lines(ax, result, label=ax is top)
    top.set_title(f"Prefill groups — {result.label}")
    return _save(fig, path)


def write_plots(result: RunResult, out_dir: Path) -> dict[str, Path]:
    paths = {"ttft_cdf": ttft_cdf(result, out_dir / "ttft_cdf.png"),
             "ttft_timeline": ttft_timeline(result, out_dir / "ttft_timeline.png")}
    if result.timeline:
        paths["groups_timeline"] = groups_timeline(result, out_dir / "groups_timeline.png")
    return paths
