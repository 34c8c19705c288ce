"""Histogram bounds shared by the gateway, the builtin engine and the SGLang plugin, so that their
`laps_*_seconds` quantiles interpolate alike and a dashboard can set one beside the other."""
from __future__ import annotations

# Seconds. From 1 ms (a GPU prefill of a short prompt, a stub round trip: below the first bound
# all samples read alike) to 600 s, the gateway's default request deadline
# (gateway/config.py DEFAULT_REQUEST_DEADLINE_S): a quantile past the last finite bound reads as
# that bound, so a TTFT or request p99 of minutes under overload would show as the bound.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0, 60.0, 120.0, 300.0, 600.0)
# Requests per prefill batch (the default batch cap is 8).
BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32)
