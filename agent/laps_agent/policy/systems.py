"""The serving systems that `laps bench compare` runs side by side and `laps sim` simulates.

A system is which policies are on: pure configuration, here beside the policies, turned from this
one definition into engine and gateway flags for `laps local` and into the simulator's settings,
so that real, emulated and simulated comparisons compare the same systems.
- `vanilla-pd`: SGLang PD as shipped: every prefill pod serves every length from one FIFO queue,
  no waiting window, each request to the least-pending prefill pod.
- `reference`: the reference LAPS (Jianshu-She/LAPS): dual queue + fixed window in which a waiting
  long batch always runs, no bound on a long request's wait, length by the router's chars/4,
  prefill pods half short, half long, moved by its pending-count rule, no admission control (it
  queues without limit), decode slots in arrival order.
- `laps`: this project: exact token counts at the gateway, the cost rule during the window, the
  starvation bound, decode slots by first-token deadline, the same half/half split moved by
  laps_agent.policy.allocation.
- `laps-static` / `laps-reference-rule`: `laps` with the split never moved / moved by the
  reference's pending-count rule (to compare allocation alone).
- `laps` and its variants route with cache affinity and classify by the expected uncached
  length (policy/routing.py, issue 12); `laps-noaffinity` is `laps` without it (full-length
  classes, least-loaded pods): the multi-turn comparison's baseline. `vanilla-pd` and `reference`
  have no affinity either (as shipped).
- `laps-pooled`: one pool of prefill pods (no length groups, no allocation loop), the dual-queue
  scheduler in every engine (classes by the length threshold inside each engine), cache affinity
  and prefix warming on: LAPS's scheduling without its routing.
- `sglang-cache-aware`: a model of SGLang's router with its default `cache_aware` policy
  (policy/cache_aware.py): an approximate prefix tree per prefill worker, the longest match when
  it covers more than half of the prompt and the pending-request counts are balanced, else the
  least-loaded worker; FIFO prefill, no waiting window, no length classes, no admission control.
  `laps sim` only (`laps local`'s gateway has no such router; `laps bench compare` refuses it).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from laps_agent.policy.allocation import DEFAULT_INTERVAL_S, AllocationConfig

ESTIMATORS = ("auto", "heuristic", "chars4")  # the gateway's --estimator modes
ROUTERS = ("predicted", "least-loaded")        # the gateway's --router modes (SystemConfig.router)
# The gateway threshold of a single pool (`vanilla-pd`): every request is "short", so every
# prefill pod (all in one group) serves every length.
SINGLE_POOL_THRESHOLD = 2**62


def moves_pods(allocation: str | None, single_pool: bool, prefill: int) -> bool:
    """Whether `laps local` runs an allocation loop (its --allocation, default laps; --single-pool
    has no groups, and one prefill engine none to move)."""
    return allocation != "none" and not single_pool and prefill >= 2


# The flags tuning that loop (dest -> flag) and their defaults, as `laps local` takes them and
# `laps sim` too (on its virtual clock); `bench compare` passes them through to `laps local`.
ALLOCATION_KNOBS = {"allocation_interval": "--allocation-interval", "allocation_ratio": "--allocation-ratio",
                    "min_per_group": "--min-per-group"}
ALLOCATION_DEFAULTS = {"allocation_interval": DEFAULT_INTERVAL_S, "allocation_ratio": AllocationConfig.ratio,
                       "min_per_group": AllocationConfig.min_per_group}


def policy_config(given: object) -> AllocationConfig:
    """The loop's policy settings from the parsed knobs (`laps local`, `laps sim`)."""
    return AllocationConfig(ratio=given.allocation_ratio, min_per_group=given.min_per_group)


def unused_allocation_flags(given: object, systems: Sequence[str], also: Sequence[str] = ()) -> str | None:
    """The knobs `given` (parsed flags) sets off their defaults, and `also` (other flags of the
    loop), when none of `systems` runs the loop: silently unused, they would read as part of a
    comparison they took no part in. None when there are none. The caller knows none runs one."""
    knobs = [*also, *(f"{flag} {getattr(given, dest):g}" for dest, flag in ALLOCATION_KNOBS.items()
                      if getattr(given, dest) != ALLOCATION_DEFAULTS[dest])]
    if not knobs:
        return None
    return (f"{', '.join(knobs)} {'tunes' if len(knobs) == 1 else 'tune'} the allocation loop, and none of the "
            f"systems ({', '.join(systems)}) runs one: leave it out, or add a system that does (laps)")


@dataclass(frozen=True)
class SystemConfig:
    name: str
    laps_scheduler: bool = True
    wait_window_ms: float = 5.0
    adaptive_window: bool = False
    long_in_window: str = "cost"
    max_long_wait_ms: float | None = None    # None: from the long TTFT SLO (scheduling.config.slo_long_wait_ms)
    max_long_batch_tokens: int | None = None   # None: the engines' default; 0: the whole batch budget
    groups: bool = True                 # False: one pool of prefill pods, no length classes
    estimator: str = "auto"             # how the gateway counts prompt tokens (ESTIMATORS)
    allocation: str = "none"            # moving pods between groups: "none" | "reference" | "laps"
    # The gateway's admission control per group (None: the gateway's default bound; 0: none, as
    # the reference router, which queues without limit).
    max_pending_tokens_per_pod: int | None = None
    affinity: bool = False              # the gateway's cache affinity + expected-uncached classes
    prefix_warm: bool = False           # answers computed into the prefill cache (engine/prefix_warm.py)
    # The prefill router: "predicted" (placement.py) | "least-loaded" (routing.py) | "cache_aware"
    # (cache_aware.py, simulated only).
    router: str = "predicted"
    # Decode slots by first-token deadline (policy/scheduling/decode_order.py) with the LAPS
    # scheduler; False: in arrival order (the reference's, stock SGLang's).
    decode_by_deadline: bool = True

    def engine_args(self) -> list[str]:
        """`laps engine` flags (passed through `laps local`)."""
        return ["--laps-scheduler" if self.laps_scheduler else "--no-laps-scheduler",
                "--wait-window-ms", f"{self.wait_window_ms:g}",
                "--adaptive-window" if self.adaptive_window else "--no-adaptive-window",
                "--long-in-window", self.long_in_window,
                *([] if self.max_long_wait_ms is None else ["--max-long-wait-ms", f"{self.max_long_wait_ms:g}"]),
                *([] if self.max_long_batch_tokens is None else
                  ["--max-long-batch-tokens", str(self.max_long_batch_tokens)]),
                *([] if self.decode_by_deadline else ["--decode-order", "fifo"])]

    @property
    def max_decode_share(self) -> float | None:
        """The gateway's decode share (admission.py rule 3): none where the system has no
        admission control (a pending bound of 0: the reference router queues without limit);
        else None, the gateway's own rule (admission.gateway_decode_share)."""
        return 0.0 if self.max_pending_tokens_per_pod == 0 else None

    def local_args(self) -> list[str]:
        """`laps local` flags of the gateway side."""
        bound = ([] if self.max_pending_tokens_per_pod is None
                 else ["--max-pending-tokens-per-pod", str(self.max_pending_tokens_per_pod)])
        if self.max_decode_share is not None:
            bound += ["--max-decode-share", f"{self.max_decode_share:g}"]
        return (["--estimator", self.estimator, "--router", self.router, "--allocation", self.allocation, *bound]
                + ([] if self.groups else ["--single-pool"])
                + ([] if self.affinity else ["--no-prefix-affinity"])
                + ["--prefix-warm" if self.prefix_warm else "--no-prefix-warm"])


SYSTEMS: dict[str, SystemConfig] = {
    "vanilla-pd": SystemConfig("vanilla-pd", laps_scheduler=False, wait_window_ms=0.0, groups=False,
                                router="least-loaded"),
    # The reference's long batches fill the whole batch budget (max_prefill_tokens).
    "reference": SystemConfig("reference", long_in_window="always", max_long_wait_ms=float("inf"),
                              max_long_batch_tokens=0, estimator="chars4", allocation="reference",
                              max_pending_tokens_per_pod=0, router="least-loaded", decode_by_deadline=False),
    "laps": SystemConfig("laps", allocation="laps", affinity=True, prefix_warm=True),
    "laps-noaffinity": SystemConfig("laps-noaffinity", allocation="laps"),
    # The allocation variants of `laps` alone (the other knobs as `laps`): for comparing how
    # pods move between the groups.
    "laps-static": SystemConfig("laps-static", allocation="none", affinity=True, prefix_warm=True),
    "laps-reference-rule": SystemConfig("laps-reference-rule", allocation="reference", affinity=True,
                                        prefix_warm=True),
    "laps-pooled": SystemConfig("laps-pooled", groups=False, affinity=True, prefix_warm=True),
    # SGLang's router (cache_aware) in front of SGLang's engines as shipped: simulated only.
    "sglang-cache-aware": SystemConfig("sglang-cache-aware", laps_scheduler=False, wait_window_ms=0.0,
                                       groups=False, max_pending_tokens_per_pod=0, router="cache_aware"),
}
# Systems `laps local` cannot start (no gateway of it routes that way): `laps sim` only.
SIM_ONLY = frozenset(name for name, s in SYSTEMS.items() if s.router == "cache_aware")


def system(name: str) -> SystemConfig:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}") from None
