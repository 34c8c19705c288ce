"""Typed settings of one gateway process (what `laps gateway` flags turn into)."""
from __future__ import annotations

from dataclasses import dataclass

from laps_agent.gateway.admission import DEFAULT_MAX_PENDING_TOKENS_PER_POD
from laps_agent.gateway.outlier import DEFAULT_MAX_EJECTION_PERCENT


@dataclass(frozen=True)
class ProxyConfig:
    connect_timeout_s: float = 5.0
    # Generation of a long answer on CPU can take minutes; this bounds silence, not total time.
    read_timeout_s: float = 300.0
    # Retries on another pair of pods after a connection-level failure (nothing sent yet).
    max_retries: int = 2
    # A pod failing this many times in a row is ejected from routing for eject_seconds...
    eject_after_failures: int = 3
    eject_seconds: float = 10.0
    # ...unless that would take more than this share of its pool (prefill group or decode
    # pool) out, or its last healthy pod (gateway/outlier.py); 0: never eject.
    max_ejection_percent: int = DEFAULT_MAX_EJECTION_PERCENT
    max_idle_connections_per_pod: int = 256


@dataclass(frozen=True)
class GatewayConfig:
    served_model_name: str = "default"
    length_threshold: int = 256
    max_body_bytes: int = 4 * 1024 * 1024
    # Seconds a client is told to wait (Retry-After) when no pod can take its request, or its
    # class is over its admission bound.
    retry_after_s: int = 1
    # Admission control (gateway/admission.py): a prefill group takes new requests while its
    # pending prompt tokens are below this many per routable pod; beyond, 429. 0: no bound.
    max_pending_tokens_per_pod: int = DEFAULT_MAX_PENDING_TOKENS_PER_POD
    proxy: ProxyConfig = ProxyConfig()
