"""What one gateway process holds (its settings, discovery, estimator, metrics, load tracking,
proxy, allocation loop and drain): built by app.create_app, read by its routes and status."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laps_agent.gateway.config import GatewayConfig
from laps_agent.gateway.discovery.membership import Discovery
from laps_agent.gateway.estimate import TokenEstimator
from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.proxy.load import LoadTracker
from laps_agent.gateway.proxy.pd import PDProxy
from laps_agent.serving.drain import Drain


@dataclass
class Gateway:
    config: GatewayConfig
    discovery: Discovery
    estimator: TokenEstimator
    metrics: GatewayMetrics
    tracker: LoadTracker
    proxy: PDProxy
    allocator: Any = None
    planner: Any = None            # laps local --autoscale (local/planner.py)
    drain: Drain = field(default_factory=Drain)   # SIGTERM: laps_agent/serving/drain.py
