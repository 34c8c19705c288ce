"""Configuration of the engine loop and what it reports per prefill batch, and the sizing of its
KV pool (torch-free, so the CLI checks flags before it imports torch)."""
from __future__ import annotations

from dataclasses import dataclass, field

from laps_agent.policy.scheduling.buckets import BATCH_PREFILL_GRAPHS_MODES
from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_agent.policy.scheduling.decode_order import DecodeOrder

# `--dtype` of `laps engine` and `laps bench engine` (loader.resolve_dtype maps them to torch).
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")

ROLES = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class EngineConfig:
    role: str = "mixed"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    batch_prefill_graphs: bool = True     # run short batches through the bucket grid (graphs on CUDA)
    # "auto": bucketed when the runner replays CUDA graphs, else only when padding costs <= 25%
    # (without graphs a padded batch is just extra work: packed eager is never slower on CPU);
    # "always" / "never" force it.
    batch_prefill_graphs_mode: str = "auto"
    max_running_requests: int = 32
    context_len: int = 2048
    idle_wait_s: float = 0.5              # upper bound on one idle sleep (also re-checks `stop`)
    # Keep the KV of full prompt pages after a request (radix tree, kv_cache.py) and skip
    # recomputing them for later prompts with the same prefix. Decode-role engines ignore it.
    prefix_cache: bool = True
    # Decode role: which request whose KV arrived takes a free slot (decode_order.py); None: FIFO.
    decode_order: DecodeOrder | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.batch_prefill_graphs_mode not in BATCH_PREFILL_GRAPHS_MODES:
            raise ValueError(f"batch_prefill_graphs_mode must be one of {BATCH_PREFILL_GRAPHS_MODES}, "
                             f"got {self.batch_prefill_graphs_mode!r}")


@dataclass
class PrefillRequest:
    """One request of a prefill batch: how much of its prompt the prefix cache saved, and the
    class it was scheduled in here (by its uncached tokens at admission) next to the class the
    gateway chose for it (the X-LAPS-Class request header; None when it sent none)."""

    prompt_tokens: int
    cached_tokens: int
    cls: str
    gateway_cls: str | None = None


@dataclass
class PrefillRecord:
    """What one prefill batch did (benchmarks and metrics read these)."""

    cls: str | None
    size: int
    real_tokens: int
    padded_tokens: int
    path: str
    bucketed: bool
    seconds: float
    requests: list[PrefillRequest] = field(default_factory=list)
    evicted_pages: int = 0                # prefix-cache pages evicted to make room since the last record


def kv_reservation(kind: str, prompt_tokens: int, max_new_tokens: int, context_len: int,
                   capacity_tokens: int) -> int:
    """KV tokens a request holds from admission on. A prefill-only request needs its prompt;
    one that decodes here reserves prompt + max_new_tokens up front (capped by the context and
    the pool), so it can never run out of pages mid-decode and nothing is ever preempted. That
    is also its sequence's budget: it stops ("length") once prompt + completion reaches it, so
    usage never passes the context (the builtin and the emulated engine both stop there)."""
    if kind == "prefill":
        return prompt_tokens
    return min(prompt_tokens + max_new_tokens, context_len, capacity_tokens)


def kv_pages_for_memory(free_bytes: int, fraction: float, *, layers: int, kv_heads: int, head_dim: int,
                        dtype_bytes: int, page_size: int) -> int:
    """KV pages that `fraction` of `free_bytes` holds (K and V of every layer, plus the scratch
    page the runner keeps). Raises ValueError when not even one page fits."""
    check_mem_fraction(fraction)
    page_bytes = 2 * layers * page_size * kv_heads * head_dim * dtype_bytes
    pages = int(free_bytes * fraction) // page_bytes - 1
    if pages < 1:
        raise ValueError(f"{free_bytes * fraction / 2**20:.0f} MiB leaves no room for one KV page "
                         f"({page_bytes / 2**20:.2f} MiB)")
    return pages


def check_mem_fraction(fraction: float) -> None:
    """--mem-fraction, the KV pool's share of free device memory: the CLI checks it before the
    load, kv_pages_for_memory when it sizes the pool on CUDA."""
    if not 0 < fraction <= 1:
        raise ValueError(f"--mem-fraction must be in (0, 1], got {fraction}")
