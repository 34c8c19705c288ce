"""Multi-turn reports (issue 12): prefix hit rate, TTFT by turn index, pod hot spots, and the
issue's targets side by side.

Works on any `RunResult` whose records carry `turn` and `cached_tokens` (`laps sim`; `laps bench`
where the server reports usage.prompt_tokens_details.cached_tokens). The hit rate is the cached
share of the prompt tokens of the requests whose cached tokens are known.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from laps_agent.lab.results.records import RunResult

TURN_BUCKETS = ("1", "2", "3", "4", "5+")
ORACLE_LABEL = "laps-oracle"   # laps sim's reference (sim/prefix.py): shown, never a candidate


@dataclass
class TurnSummary:
    requests: int
    hit_rate: float | None                      # cached / prompt tokens (None: not reported)
    ttft_p90_by_turn: dict[str, float] = field(default_factory=dict)
    count_by_turn: dict[str, int] = field(default_factory=dict)
    ttft_p90_later: float = float("nan")          # turns >= 2
    oracle_hit_rate: float | None = None          # from meta["prefix"] when the tool knows it
    pod_load: dict[str, float] = field(default_factory=dict)   # group -> max pod load / group mean


def _p90(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, 90)) if values.size else float("nan")


def summarize_turns(result: RunResult) -> TurnSummary:
    rec = result.records
    ok = rec.ok
    turn, ttft = rec.turn, rec.ttft_s.astype(float)
    cached, prompt = rec.cached_tokens, rec.prompt_tokens
    known = ok & (cached >= 0)
    hit = float(cached[known].sum() / prompt[known].sum()) if known.any() and prompt[known].sum() else None
    out = TurnSummary(len(rec), hit)
    for name in TURN_BUCKETS:
        k = int(name.rstrip("+"))
        mask = ok & ((turn >= k) if name.endswith("+") else (turn == k))
        out.count_by_turn[name] = int(mask.sum())
        out.ttft_p90_by_turn[name] = _p90(ttft[mask])
    out.ttft_p90_later = _p90(ttft[ok & (turn >= 2)])
    prefix = result.meta.get("prefix") or {}
    out.oracle_hit_rate = prefix.get("oracle_hit_rate")
    out.pod_load = dict(prefix.get("pod_load") or {})
    return out


def _ms(v: float) -> str:
    return "-" if v != v else f"{v * 1000:.0f} ms"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def turns_markdown(labelled: list[tuple[str, TurnSummary]]) -> str:
    head = "| | " + " | ".join(label for label, _ in labelled) + " |"
    lines = [head, "|---" * (len(labelled) + 1) + "|",
             "| prefix hit rate | " + " | ".join(_pct(s.hit_rate) for _, s in labelled) + " |"]
    for name in TURN_BUCKETS:
        lines.append(f"| TTFT p90, turn {name} | " + " | ".join(
            f"{_ms(s.ttft_p90_by_turn.get(name, float('nan')))} (n={s.count_by_turn.get(name, 0)})"
            for _, s in labelled) + " |")
    lines.append("| TTFT p90, turns >= 2 | " + " | ".join(_ms(s.ttft_p90_later) for _, s in labelled) + " |")
    lines.append("| max pod load / group mean | " + " | ".join(
        ", ".join(f"{g} {v:.2f}" for g, v in s.pod_load.items()) or "-" for _, s in labelled) + " |")
    return "\n".join(lines)


def targets_markdown(baseline: tuple[str, TurnSummary], candidate: tuple[str, TurnSummary],
                     reference: tuple[str, TurnSummary] | None = None) -> str:
    """Issue 12's targets for `candidate` against `baseline` (full-length classes, no affinity);
    `reference`: the oracle's run (`laps sim`'s laps-oracle, every earlier turn cached), a reference."""
    (base_label, base), (label, cand) = baseline, candidate
    ratio = cand.ttft_p90_later / base.ttft_p90_later if base.ttft_p90_later else float("nan")
    oracle = cand.oracle_hit_rate
    of_oracle = (cand.hit_rate / oracle) if (cand.hit_rate is not None and oracle) else float("nan")
    hottest = max(cand.pod_load.values(), default=float("nan"))

    def verdict(ok: bool, value: float) -> str:
        return "n/a" if value != value else ("met" if ok else "MISSED")

    rows = [
        ("TTFT p90 of turns >= 2", f"{_ms(cand.ttft_p90_later)} vs {_ms(base.ttft_p90_later)} = {ratio:.2f}x",
         "<= 0.6x", verdict(ratio <= 0.6, ratio)),
        ("prefix hit rate vs oracle", f"{_pct(cand.hit_rate)} of {_pct(oracle)} = {of_oracle:.0%}"
         if of_oracle == of_oracle else "-", ">= 70%", verdict(of_oracle >= 0.7, of_oracle)),
        ("max pod load / group mean", ", ".join(f"{g} {v:.2f}" for g, v in cand.pod_load.items()) or "-",
         "<= 1.5", verdict(hottest <= 1.5, hottest)),
    ]
    if reference is not None:
        best = reference[1].ttft_p90_later
        rows.insert(1, (f"the same for {reference[0]} (every earlier turn cached)",
                        f"{_ms(best)} = {best / base.ttft_p90_later:.2f}x" if base.ttft_p90_later else "-",
                        "-", "reference"))
    lines = [f"## targets (issue 12): {label} vs {base_label}", "",
             "| target | measured | goal | |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def turns_report(turns: list[tuple[str, TurnSummary]]) -> str:
    """The multi-turn table and, with a baseline and a candidate, issue 12's targets: `laps`
    against `laps-noaffinity` where both ran, else the last system against the first (what
    `laps sim`, `laps bench run` and `laps bench compare` print)."""
    text = "## multi-turn: prefix hit rate and TTFT by turn\n\n" + turns_markdown(turns)
    names = [name for name, _ in turns]
    if len(turns) > 1:
        base = turns[names.index("laps-noaffinity")] if "laps-noaffinity" in names else turns[0]
        cand = turns[names.index("laps")] if "laps" in names else next(
            (t for t in reversed(turns) if t[0] != ORACLE_LABEL), turns[-1])
        reference = turns[names.index(ORACLE_LABEL)] if ORACLE_LABEL in names else None
        if base is not cand:
            text += "\n\n" + targets_markdown(base, cand, reference)
    return text


def pod_load(busy: dict[str, float], groups: dict[str, list[str]]) -> dict[str, float]:
    """Per group, its busiest pod's busy time over the group's mean (pods in the group at the
    end of the run; a pod moved between groups counts where it ended)."""
    out = {}
    for group, pods in groups.items():
        values = [busy[p] for p in pods if p in busy]
        mean = sum(values) / len(values) if values else 0.0
        if mean > 0:
            out[group] = max(values) / mean
    return out
