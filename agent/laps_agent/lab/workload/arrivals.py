"""Arrival times of one phase, relative to the phase start, vectorised.

- poisson: exponential gaps of mean 1/rate; the first request one gap after the phase start.
- constant: evenly spaced, request i (from 1) at i/rate.
- bursty: a Poisson process whose rate is `rate * burst_factor` during the first `burst_s`
  seconds of every `period_s` (counted from the phase start) and `rate` for the rest of the
  period; mean rate = rate * (1 + (burst_factor - 1) * burst_s / period_s). Drawn by time
  rescaling: unit-rate Poisson points mapped through the inverse of the cumulative intensity.

`count(process, n)` gives the first n arrivals; `until(process, horizon)` all arrivals before
`horizon` seconds (the count is random, as in the real process), or only the first `limit` of
them, drawn without drawing the rest (a `--max-requests` run of a huge phase) and identical to
the first `limit` of the unlimited draw.
"""
from __future__ import annotations

import numpy as np

from laps_agent.lab.workload.spec import Bursty, Constant, Poisson


def scaled(process, factor: float):
    """The same process with every rate multiplied by `factor` (burst timing unchanged)."""
    if factor == 1.0:
        return process
    return process.model_copy(update={"rate": process.rate * factor})


def count(process, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(process, Constant):
        return np.arange(1, n + 1, dtype=np.float64) / process.rate
    unit = np.cumsum(rng.exponential(1.0, size=n))
    return _map_unit(process, unit)


def until(process, horizon: float, rng: np.random.Generator, limit: int | None = None) -> np.ndarray:
    if isinstance(process, Constant):
        n = int(np.floor(horizon * process.rate + 1e-9))
        n = n if limit is None else min(n, limit)
        times = np.arange(1, n + 1, dtype=np.float64) / process.rate
        return times[times < horizon]
    # Unit-rate points up to the cumulative intensity at the horizon, drawn in blocks.
    target = _intensity(process, horizon)
    chunks, total, drawn = [], 0.0, 0
    while True:
        block = max(64, int(target - total + 6 * np.sqrt(max(target - total, 1.0))) + 16)
        if limit is not None:
            block = min(block, max(64, limit - drawn))
        # The running total leads the cumulative sum, so blocks add up exactly as one draw would.
        unit = np.cumsum(np.concatenate(([total], rng.exponential(1.0, size=block))))[1:]
        chunks.append(unit)
        total, drawn = float(unit[-1]), drawn + block
        if total >= target or (limit is not None and drawn >= limit):
            break
    unit = np.concatenate(chunks)
    unit = unit[unit < target][:limit]
    return _map_unit(process, unit)


def _intensity(process, t: float) -> float:
    """Expected arrivals in [0, t)."""
    if isinstance(process, Poisson):
        return process.rate * t
    assert isinstance(process, Bursty)
    per_period = process.mean_rate * process.period_s
    k, rem = divmod(t, process.period_s)
    high = process.rate * process.burst_factor
    in_period = high * min(rem, process.burst_s) + process.rate * max(0.0, rem - process.burst_s)
    return k * per_period + in_period


def _map_unit(process, unit: np.ndarray) -> np.ndarray:
    """Times of unit-rate Poisson points `unit` under the process's intensity."""
    if isinstance(process, Poisson):
        return unit / process.rate
    assert isinstance(process, Bursty)
    high = process.rate * process.burst_factor
    per_period = process.mean_rate * process.period_s
    burst_mass = high * process.burst_s
    k = np.floor(unit / per_period)
    rem = unit - k * per_period
    inside = rem < burst_mass
    offset = np.where(inside, rem / high, process.burst_s + (rem - burst_mass) / process.rate)
    return k * process.period_s + offset
