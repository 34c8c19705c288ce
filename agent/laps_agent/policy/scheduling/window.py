"""The waiting window for short prefills, fixed or adaptive (wait-depth tuning).

Waiting merges short prompts into one batch: one per-batch overhead saved per merged request, at
the price of delaying those already queued. Fixed (the reference's): wait up to `wait_window_ms`
after the oldest short request arrived, or until `wait_max_batch` of them wait.

Adaptive (`adaptive_window=True`), from a batch cost model seconds ~= a + b*T (T uncached tokens,
exponentially weighted least squares over `observe_prefill`) and EWMAs of the short requests'
inter-arrival time ia and uncached tokens s: the target depth is
    D = max(1, ceil((a - ia) / (ia + b*s)))
bounded by max_batch_size, the bucket grid's largest batch size and max_prefill_tokens // s (the
first two also bound the fixed wait_max_batch); the window is (D-1)*ia, clamped to
[0, wait_window_ms * adaptive_window_factor]; D = 1 means "dispatch at once". Until both
estimates exist (two short arrivals, prefill samples with distinct token counts) the fixed
values apply; wait_window_ms = 0 disables the window in both modes.
Split (adaptive mode only): a ready short batch of n goes as its first k, the smallest k that
minimises n*(a + b*T_k) + (n-k)*(a + b*(T_n - T_k)) (T_k: tokens of the first k); the rest is
decided afresh at the next dispatch. Derivations: docs/design/scheduler.md.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from laps_agent.policy.scheduling.buckets import BucketGrid
from laps_agent.policy.scheduling.config import SchedulerConfig

# Memory of the cost fit: ~1/_COST_DECAY batches. Longer than the arrival EWMA because the cost
# of a batch changes only with the hardware/model, while arrival rates change with traffic.
_COST_DECAY = 0.05
# Token counts must spread by at least this relative stddev before overhead and per-token cost
# can be told apart; with less, the fit would be noise.
_MIN_RELATIVE_SPREAD = 0.05
# A per-token cost below this share of a mean batch's time is rounding, not cost (a profile with a
# fixed cost per batch gives two calibration prefills the same time): read as none.
_NEGLIGIBLE_TOKEN_SHARE = 1e-6
# The prompt lengths an engine times at start-up (engine/calibration.py, and the emulated engine
# from its profile): far enough apart that the fit separates the per-batch overhead from the
# per-token cost, and short enough to take about a second on a CPU.
CALIBRATION_TOKENS = (64, 1024)


def calibration_lengths(max_prompt_tokens: int, max_prefill_tokens: int) -> list[int]:
    """The calibration prefill lengths an engine that takes prompts of at most
    `max_prompt_tokens` in batches of at most `max_prefill_tokens` can run (one length only
    where the shorter limit is below both)."""
    longest = min(max_prompt_tokens, max_prefill_tokens)
    return sorted({max(1, min(tokens, longest)) for tokens in CALIBRATION_TOKENS})


class PrefillCostModel:
    """seconds ~= overhead + per_token * tokens, exponentially weighted least squares."""

    def __init__(self) -> None:
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.samples = 0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or not seconds >= 0 or math.isinf(seconds):
            return
        keep = 1.0 - _COST_DECAY
        self._w = self._w * keep + 1.0
        self._x = self._x * keep + tokens
        self._y = self._y * keep + seconds
        self._xx = self._xx * keep + tokens * tokens
        self._xy = self._xy * keep + tokens * seconds
        self.samples += 1

    def coefficients(self) -> tuple[float, float] | None:
        """(overhead seconds, seconds per token), or None while they cannot be separated."""
        if self.samples < 2:
            return None
        mean_x = self._x / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x <= (_MIN_RELATIVE_SPREAD * mean_x) ** 2:
            return None
        mean_y = self._y / self._w
        per_token = (self._xy / self._w - mean_x * mean_y) / var_x
        overhead = mean_y - per_token * mean_x
        if per_token < 0 or per_token * mean_x <= _NEGLIGIBLE_TOKEN_SHARE * mean_y:
            return max(mean_y, 0.0), 0.0   # noise: cost does not fall (or rise) with more tokens
        if overhead < 0:   # noise the other way: refit through the origin
            return 0.0, self._xy / self._xx
        return overhead, per_token

    def linear(self) -> tuple[float, float] | None:
        """(overhead seconds, seconds per token) to predict with: the fit, or while overhead and
        per-token cost cannot be told apart the one operating point known, scaled
        proportionally (no overhead); None before any sample."""
        if self.samples == 0:
            return None
        return self.coefficients() or (0.0, self._y / self._x)

    def predict(self, tokens: int) -> float | None:
        """Expected seconds for a batch of `tokens` uncached tokens; None before any sample."""
        line = self.linear()
        return None if line is None else line[0] + line[1] * tokens


class Ewma:
    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def update(self, sample: float) -> float:
        self.value = sample if self.value is None else self.alpha * sample + (1 - self.alpha) * self.value
        return self.value


@dataclass(frozen=True)
class WindowSetting:
    window_s: float     # hold short requests at most this long after the oldest arrived
    target_depth: int   # dispatch at once when this many short requests wait
    source: str         # "disabled" | "fixed" | "adaptive"


class WaitWindow:
    """Holds the window state of one scheduler; pure arithmetic on the caller's clock."""

    def __init__(self, config: SchedulerConfig, grid: BucketGrid | None = None) -> None:
        self.config = config
        self.max_window_s = config.wait_window_s * (config.adaptive_window_factor if config.adaptive_window else 1.0)
        depth_cap = config.max_batch_size
        if grid is not None:
            depth_cap = min(depth_cap, grid.max_batch_size)
        self.depth_cap = max(1, depth_cap)
        self.cost = PrefillCostModel()
        self.inter_arrival = Ewma(config.ewma_alpha)
        self.short_tokens = Ewma(config.ewma_alpha)
        self._last_short_arrival: float | None = None
        self._last_gap: float | None = None
        self._setting = self._fixed()

    def _fixed(self) -> WindowSetting:
        if self.config.wait_window_s <= 0:
            return WindowSetting(0.0, 1, "disabled")
        # Waiting for more requests than one batch (or the largest captured bucket) can take
        # gains nothing, so the grid caps the fixed depth too.
        return WindowSetting(self.config.wait_window_s, min(self.config.wait_max_batch, self.depth_cap), "fixed")

    def note_short_arrival(self, now: float, uncached: int) -> None:
        if self.max_window_s <= 0:
            return
        self.short_tokens.update(float(uncached))
        if self._last_short_arrival is not None:
            # A long idle gap already means "do not wait"; capping it lets the estimate recover
            # within a few arrivals once traffic picks up again.
            gap = min(max(now - self._last_short_arrival, 0.0), 10 * self.max_window_s)
            self.inter_arrival.update(gap)
            self._last_gap = gap
        self._last_short_arrival = now if self._last_short_arrival is None else max(now, self._last_short_arrival)
        if self.config.adaptive_window:
            self._setting = self._adaptive()

    def arrival_expected_by(self, deadline: float) -> bool:
        """Whether another short request is expected to arrive by `deadline`: the last one's
        arrival plus the shorter of the mean gap and the last gap (the last one alone sees a
        burst begin). A window that expects none only delays the ones it holds."""
        last = self._last_short_arrival
        gaps = [g for g in (self.inter_arrival.value, self._last_gap) if g is not None]
        return last is not None and bool(gaps) and last + min(gaps) <= deadline

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        self.cost.observe(tokens, seconds)
        if self.config.adaptive_window and self.max_window_s > 0:
            self._setting = self._adaptive()

    def expected_seconds(self, tokens: int) -> float | None:
        return self.cost.predict(tokens)

    def setting(self) -> WindowSetting:
        return self._setting

    def split_count(self, tokens: Sequence[int]) -> int:
        """How many of these queued short requests (FIFO order) the next batch takes; see the
        module docstring. All of them outside adaptive mode or without a cost estimate."""
        n = len(tokens)
        coef = self.cost.coefficients() if self.config.adaptive_window and n > 1 else None
        if coef is None:
            return n
        overhead, per_token = coef
        total = float(sum(tokens))
        best_k, best = n, n * (overhead + per_token * total)
        prefix = 0.0
        for k in range(1, n):
            prefix += tokens[k - 1]
            summed = n * (overhead + per_token * prefix) + (n - k) * (overhead + per_token * (total - prefix))
            if summed < best * (1 - 1e-9):
                best_k, best = k, summed
        return best_k

    def _adaptive(self) -> WindowSetting:
        coef = self.cost.coefficients()
        ia, s = self.inter_arrival.value, self.short_tokens.value
        if coef is None or ia is None or s is None:
            return self._fixed()
        overhead, per_token = coef
        cap = min(self.depth_cap, max(1, int(self.config.max_prefill_tokens // max(s, 1.0))))
        denominator = ia + per_token * s
        if overhead <= ia:
            depth = 1
        elif denominator <= 0:
            depth = cap
        else:
            depth = min(cap, max(1, math.ceil((overhead - ia) / denominator)))
        window = min(max((depth - 1) * ia, 0.0), self.max_window_s)
        return WindowSetting(window, depth, "adaptive")
