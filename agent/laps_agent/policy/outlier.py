"""Outlier ejection cap (pure): how much of a pool passive health checks may take out.

A pool is one prefill group or the decode pool. Ejecting a pod moves its traffic to the rest of
its pool; ejecting the *last* pod takes a class (or, for decode, everything) out of service, and
an overload that makes every pod look failing would do exactly that. So, as Envoy's
max_ejection_percent caps outlier detection, ejection is refused when it would leave the pool
with more than `max_percent` of its pods ejected (but one pod may always go when two or more are
healthy), and never removes the last healthy pod. Passive health stays a routing hint: a pod
that really is gone still fails fast, and each request's retries exclude it anyway."""
from __future__ import annotations

# Half of a pool at most: with two pods one may go, a single pod never does.
DEFAULT_MAX_EJECTION_PERCENT = 50


def ejection_cap(pool_size: int, max_percent: int) -> int:
    """Most pods of the pool that may be ejected at once (0 when ejection is off)."""
    if max_percent <= 0 or pool_size <= 1:
        return 0
    return min(pool_size - 1, max(1, pool_size * max_percent // 100))


def may_eject(pool_size: int, ejected: int, max_percent: int) -> bool:
    """Whether one more pod of a pool of `pool_size` pods, `ejected` of them already out, may go."""
    return ejected < ejection_cap(pool_size, max_percent)
