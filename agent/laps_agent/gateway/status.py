"""The `/laps_status` document: threshold, groups with their pods, pending work per group."""
from __future__ import annotations

from typing import TYPE_CHECKING

from laps_agent.gateway.discovery import GROUP_NAMES
from laps_agent.gateway.routing import Endpoint, EndpointLoad

if TYPE_CHECKING:
    from laps_agent.gateway.app import Gateway


def _pod(endpoint: Endpoint, load: EndpointLoad | None) -> dict:
    load = load or EndpointLoad()
    return {"name": endpoint.name, "url": endpoint.url, "bootstrap_host": endpoint.bootstrap_host,
            "bootstrap_port": endpoint.bootstrap_port, "healthy": load.healthy,
            "pending_requests": load.pending_requests, "pending_tokens": load.pending_tokens}


def laps_status(gateway: Gateway) -> dict:
    membership = gateway.discovery.membership()
    loads = gateway.tracker.loads()
    groups = {}
    for group in GROUP_NAMES:
        requests, tokens = gateway.tracker.group_pending(group)
        groups[group] = {"pods": [_pod(e, loads.get(e.name)) for e in membership.groups.get(group, ())],
                         "pending_requests": requests, "pending_tokens": tokens}
    allocation = gateway.allocator.status() if gateway.allocator is not None else {"enabled": False}
    return {"enabled": True, "served_model_name": gateway.config.served_model_name,
            "threshold": gateway.config.length_threshold, "groups": groups,
            "decode": {"pods": [_pod(e, loads.get(e.name)) for e in membership.decode]},
            "allocation": allocation}
