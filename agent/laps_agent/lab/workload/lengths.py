"""Token-length distributions, sampled vectorised with numpy (a simulator plans millions).

`lognormal` with min/max is *truncated by redrawing*: values outside [min, max] are drawn again,
so no probability mass piles up at the bounds (clamping would put a spike there); after
`_MAX_REDRAWS` rounds the few values still outside (only when the bounds hold almost none of the
distribution's mass) are clamped. Samples are rounded to integers.

LMSYS_LIKE, the `lmsys` distribution, is the built-in prompt-length mix: the FULL CONTEXT a PD
prefill server receives per request for LMSYS-Chat-1M-like multi-turn chat (no prefix cache:
every turn resends the conversation). It is a 3-lognormal fit (median 117, p90 983, mean 349
tokens, 63.5% <= 256, 90.7% <= 1024) to a simulation of conversations anchored on the data set's
published statistics; the sources, the inferences and the fit: docs/design/workload-lengths.md.
"""
from __future__ import annotations

import numpy as np

from laps_agent.lab.workload.spec import Fixed, Jsonl, Lmsys, LogNormal, Mixture, Uniform

_MAX_REDRAWS = 64

# See the module docstring for the source; clipped to [1, 16384] by redrawing.
LMSYS_LIKE = Mixture(distribution="mixture", components=[
    # mostly first turns: one short user message
    LogNormal(distribution="lognormal", weight=0.374, median=12.3, sigma=0.659, min=1, max=16384),
    # second turns and long first messages
    LogNormal(distribution="lognormal", weight=0.352, median=165.9, sigma=0.935, min=1, max=16384),
    # later turns: earlier prompts and answers resent with the new prompt
    LogNormal(distribution="lognormal", weight=0.274, median=712.8, sigma=0.720, min=1, max=16384),
])


def sample_lengths(dist, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` integer token counts (int64, all >= 1) drawn from `dist`."""
    if isinstance(dist, Fixed):
        return np.full(n, dist.value, dtype=np.int64)
    if isinstance(dist, Uniform):
        return rng.integers(dist.min, dist.max, size=n, endpoint=True, dtype=np.int64)
    if isinstance(dist, LogNormal):
        return _lognormal(dist, n, rng)
    if isinstance(dist, Lmsys):
        return sample_lengths(LMSYS_LIKE, n, rng)
    if isinstance(dist, Mixture):
        return _mixture(dist, n, rng)
    if isinstance(dist, Jsonl):
        raise ValueError("jsonl lengths come from the file (plan_requests reads it)")
    raise TypeError(f"not a length distribution: {dist!r}")


def _lognormal(dist: LogNormal, n: int, rng: np.random.Generator) -> np.ndarray:
    mu = np.log(dist.median)
    lo, hi = dist.min, dist.max if dist.max is not None else np.iinfo(np.int32).max
    values = np.rint(rng.lognormal(mu, dist.sigma, size=n))
    bad = np.flatnonzero((values < lo) | (values > hi))
    for _ in range(_MAX_REDRAWS):
        if bad.size == 0:
            break
        values[bad] = np.rint(rng.lognormal(mu, dist.sigma, size=bad.size))
        bad = bad[(values[bad] < lo) | (values[bad] > hi)]
    return np.clip(values, lo, hi).astype(np.int64)


def _mixture(dist: Mixture, n: int, rng: np.random.Generator) -> np.ndarray:
    weights = np.array([c.weight for c in dist.components], dtype=np.float64)
    which = rng.choice(len(weights), size=n, p=weights / weights.sum())
    out = np.empty(n, dtype=np.int64)
    for i, component in enumerate(dist.components):
        idx = np.flatnonzero(which == i)
        if idx.size:
            out[idx] = sample_lengths(component, idx.size, rng)
    return out


def length_bounds(dist) -> tuple[int, int | None]:
    """Smallest and largest value `dist` can produce (None: unbounded); for reports and tests."""
    if isinstance(dist, Fixed):
        return dist.value, dist.value
    if isinstance(dist, Uniform):
        return dist.min, dist.max
    if isinstance(dist, LogNormal):
        return dist.min, dist.max
    if isinstance(dist, Lmsys):
        return length_bounds(LMSYS_LIKE)
    if isinstance(dist, Mixture):
        bounds = [length_bounds(c) for c in dist.components]
        highs = [b[1] for b in bounds]
        return min(b[0] for b in bounds), None if None in highs else max(highs)
    return 1, None
