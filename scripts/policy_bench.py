"""Policy-only benchmark: one simulated prefill worker, FIFO vs LAPS variants (prints a table).

    python -m scripts.policy_bench [--overhead-ms 10 --per-token-us 1 --rate 300]

Poisson arrivals (85% short prompts of --short-tokens, 15% long of --long-tokens); a batch of T
uncached tokens takes overhead + per_token * T of simulated time; the worker asks for a batch
whenever it is free. Only the scheduling policy runs (no model), so it takes about a second and
shows what the rules in queues.py/window.py do to time-to-first-token (= prefill completion).
"reference rule" is the reference's "long always runs while the window holds short ones".
"""
from __future__ import annotations

import argparse
import dataclasses
import random
from dataclasses import dataclass

from laps_agent.policy.scheduling.config import SchedulerConfig
from laps_agent.policy.scheduling.queues import PrefillItem, PrefillScheduler


@dataclass(frozen=True)
class Workload:
    overhead_s: float = 0.010
    per_token_s: float = 1e-6
    rate: float = 300.0
    short_tokens: int = 40
    long_tokens: int = 1200
    short_share: float = 0.85
    requests: int = 4000
    seed: int = 0


def simulate(config: SchedulerConfig, load: Workload, reference_rule: bool = False) -> dict[str, list[float]]:
    """TTFT samples (seconds) per class."""
    rng = random.Random(load.seed)
    arrivals, t = [], 0.0
    for _ in range(load.requests):
        t += rng.expovariate(load.rate)
        arrivals.append((t, load.short_tokens if rng.random() < load.short_share else load.long_tokens))
    if reference_rule:
        config = dataclasses.replace(config, long_in_window="always")
    sched = PrefillScheduler(config)
    ttft: dict[str, list[float]] = {"short": [], "long": []}
    cls_of: dict[str, str] = {}
    now, i = 0.0, 0
    while i < len(arrivals) or len(sched):
        while i < len(arrivals) and arrivals[i][0] <= now:
            rid = str(i)
            cls_of[rid] = sched.add(PrefillItem(rid, arrivals[i][1], arrival=arrivals[i][0]), arrivals[i][0])
            i += 1
        decision = sched.next_batch(now)
        if decision.batch:
            took = load.overhead_s + load.per_token_s * sum(item.uncached for item in decision.batch)
            sched.observe_prefill(decision.batch, took)
            now += took
            for item in decision.batch:
                ttft[cls_of[item.rid]].append(now - item.arrival)
        else:
            upcoming = [arrivals[i][0]] if i < len(arrivals) else []
            if decision.wake_at is not None:
                upcoming.append(decision.wake_at)
            now = max(now, min(upcoming))
    return ttft


def _summary(samples: list[float]) -> str:
    if not samples:
        return "       -"
    ordered = sorted(samples)
    mean = sum(ordered) / len(ordered)
    return f"mean {mean * 1000:8.1f} ms  p90 {ordered[int(0.9 * (len(ordered) - 1))] * 1000:8.1f} ms"


def run(load: Workload, window_ms: float, max_long_wait_ms: float) -> list[tuple[str, dict[str, list[float]]]]:
    variants = [
        ("FIFO", SchedulerConfig(enabled=False), False),
        ("LAPS, no window", SchedulerConfig(wait_window_ms=0, max_long_wait_ms=max_long_wait_ms), False),
        (f"LAPS, window {window_ms:g} ms, reference rule",
         SchedulerConfig(wait_window_ms=window_ms, max_long_wait_ms=max_long_wait_ms), True),
        (f"LAPS, window {window_ms:g} ms, our rule",
         SchedulerConfig(wait_window_ms=window_ms, max_long_wait_ms=max_long_wait_ms), False),
        (f"LAPS, adaptive window (<= {4 * window_ms:g} ms)",
         SchedulerConfig(wait_window_ms=window_ms, adaptive_window=True, max_long_wait_ms=max_long_wait_ms), False),
    ]
    return [(name, simulate(config, load, ref)) for name, config, ref in variants]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.policy_bench", description=__doc__.split("\n")[0])
    p.add_argument("--overhead-ms", type=float, default=10.0, help="fixed cost per prefill batch")
    p.add_argument("--per-token-us", type=float, default=1.0, help="cost per uncached token")
    p.add_argument("--rate", type=float, default=300.0, help="requests per second")
    p.add_argument("--short-tokens", type=int, default=40)
    p.add_argument("--long-tokens", type=int, default=1200)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--window-ms", type=float, default=5.0)
    p.add_argument("--max-long-wait-ms", type=float, default=2000.0)
    a = p.parse_args(argv)
    load = Workload(a.overhead_ms / 1000, a.per_token_us / 1e6, a.rate, a.short_tokens, a.long_tokens,
                    requests=a.requests)
    print(f"cost {a.overhead_ms:g} ms/batch + {a.per_token_us:g} us/token, {a.rate:g} req/s, "
          f"short {a.short_tokens} / long {a.long_tokens} tokens")
    for name, ttft in run(load, a.window_ms, a.max_long_wait_ms):
        print(f"{name:40s} short TTFT {_summary(ttft['short'])} | long TTFT {_summary(ttft['long'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
