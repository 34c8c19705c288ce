"""Configuration of the LAPS prefill scheduler (engine-agnostic, torch-free)."""
from __future__ import annotations

from dataclasses import dataclass

from laps_agent.policy.classes import DEFAULT_LENGTH_THRESHOLD, LONG

LONG_IN_WINDOW_RULES = ("cost", "always")


def long_batch_budget(max_prefill_tokens: int, max_long_batch_tokens: int) -> int:
    """The uncached-token budget of a long batch: max_long_batch_tokens within the whole batch
    budget (0: all of it). The dual queue batches by it and the gateway predicts with it."""
    return min(max_long_batch_tokens, max_prefill_tokens) if max_long_batch_tokens else max_prefill_tokens


# The starvation bound's share of the long TTFT SLO where that is the tighter bound: a long
# request that has waited it runs next, and the rest of its SLO is left for the batch under way
# and its own prefill (the default bound is this share of the default 3 s SLO). A fixed bound
# makes a tighter long SLO missed by design (docs/design/scheduler.md, "It follows the long SLO").
LONG_WAIT_SLO_SHARE = 2 / 3


def slo_long_wait_ms(long_ttft_slo_s: float) -> float:
    """The starvation bound where none is set: the default (SchedulerConfig.max_long_wait_ms), or
    LONG_WAIT_SLO_SHARE of the long TTFT SLO where that is less."""
    return min(SchedulerConfig.max_long_wait_ms, round(LONG_WAIT_SLO_SHARE * long_ttft_slo_s * 1000.0, 1))


@dataclass(frozen=True)
class SchedulerConfig:
    enabled: bool = True              # False -> plain FIFO, one queue (the comparison baseline)
    length_threshold: int = DEFAULT_LENGTH_THRESHOLD       # uncached tokens <= threshold -> short
    wait_window_ms: float = 5.0       # 0 disables the window
    wait_max_batch: int = 8           # dispatch at once when this many short requests wait
    adaptive_window: bool = False     # tune window/target depth from arrivals and fill times
    max_long_wait_ms: float = 2000.0  # starvation bound for long requests (slo_long_wait_ms)
    max_batch_size: int = 8           # requests per prefill batch
    max_prefill_tokens: int = 8192    # uncached-token budget per prefill batch
    # A long batch's uncached tokens at most (within max_prefill_tokens; at least one request;
    # 0: the whole max_prefill_tokens): a short request that arrives at a busy pod waits for one
    # long batch, so this bounds its wait (4,096: about 0.4 s of a 32B model on an H200; what it
    # buys and costs on the workload matrix, docs/design/scheduler.md).
    max_long_batch_tokens: int = 4096
    # Additions (not in the first contract draft):
    # adaptive windows may grow up to wait_window_ms * adaptive_window_factor
    adaptive_window_factor: float = 4.0
    # weight of the newest sample in the EWMAs of the adaptive mode
    ewma_alpha: float = 0.2
    # While the window holds short requests and long ones wait: "cost" runs the long batch only
    # if that costs the held short ones less (queues.py rule 3); "always" is the reference's rule.
    long_in_window: str = "cost"

    def __post_init__(self) -> None:
        problems = []
        if self.length_threshold < 0:
            problems.append(f"length_threshold must be >= 0, got {self.length_threshold}")
        if not self.wait_window_ms >= 0:  # also rejects NaN
            problems.append(f"wait_window_ms must be >= 0, got {self.wait_window_ms}")
        if self.wait_max_batch < 1:
            problems.append(f"wait_max_batch must be >= 1, got {self.wait_max_batch}")
        if not self.max_long_wait_ms >= 0:
            problems.append(f"max_long_wait_ms must be >= 0, got {self.max_long_wait_ms}")
        if self.max_batch_size < 1:
            problems.append(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_prefill_tokens < 1:
            problems.append(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.max_long_batch_tokens < 0:
            problems.append(f"max_long_batch_tokens must be >= 0, got {self.max_long_batch_tokens}")
        if not self.adaptive_window_factor >= 1:
            problems.append(f"adaptive_window_factor must be >= 1, got {self.adaptive_window_factor}")
        if self.long_in_window not in LONG_IN_WINDOW_RULES:
            problems.append(f"long_in_window must be one of {LONG_IN_WINDOW_RULES}, got {self.long_in_window!r}")
        if not 0 < self.ewma_alpha <= 1:
            problems.append(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha}")
        if problems:
            raise ValueError("invalid SchedulerConfig: " + "; ".join(problems))

    @property
    def wait_window_s(self) -> float:
        return self.wait_window_ms / 1000.0

    @property
    def max_long_wait_s(self) -> float:
        return self.max_long_wait_ms / 1000.0

    def batch_tokens(self, queue: str) -> int:
        """The uncached-token budget of a batch from `queue` (a long batch's is the smaller)."""
        if queue == LONG:
            return long_batch_budget(self.max_prefill_tokens, self.max_long_batch_tokens)
        return self.max_prefill_tokens
