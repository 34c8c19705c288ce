"""Typed settings of one gateway process (what `laps gateway` flags turn into)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProxyConfig:
    connect_timeout_s: float = 5.0
    # Generation of a long answer on CPU can take minutes; this bounds silence, not total time.
    read_timeout_s: float = 300.0
    # Retries on another pair of pods after a connection-level failure (nothing sent yet).
    max_retries: int = 2
    # A pod failing this many times in a row is ejected from routing for eject_seconds.
    eject_after_failures: int = 3
    eject_seconds: float = 10.0
    max_idle_connections_per_pod: int = 256


@dataclass(frozen=True)
class GatewayConfig:
    served_model_name: str = "default"
    length_threshold: int = 256
    max_body_bytes: int = 4 * 1024 * 1024
    # Seconds a client is told to wait (Retry-After) when no pod can take its request.
    retry_after_s: int = 1
    proxy: ProxyConfig = ProxyConfig()
