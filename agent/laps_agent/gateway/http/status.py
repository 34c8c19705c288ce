"""The `/laps_status` document (threshold, the engines' longest prompt, groups with their pods,
pending work and admission bound per group; the decode pool's pods, slots and each class's share
of them) and readiness (can this gateway route at all)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from laps_agent.gateway.discovery.membership import Membership
from laps_agent.gateway.http.context import engines_limit
from laps_agent.gateway.http.state import Gateway
from laps_agent.policy.admission import decode_held, decode_share_bound, decode_slots, group_bound
from laps_agent.policy.classes import CLASSES
from laps_agent.policy.routing import Endpoint, EndpointLoad


def _pod(endpoint: Endpoint, load: EndpointLoad | None, engine_load: dict | None) -> dict:
    """`pending_*`: this gateway's own; `engine_load`: the engine's last /get_load figures."""
    load = load or EndpointLoad()
    return {"name": endpoint.name, "url": endpoint.url, "bootstrap_host": endpoint.bootstrap_host,
            "bootstrap_port": endpoint.bootstrap_port, "healthy": load.healthy,
            "pending_requests": load.pending_requests, "pending_tokens": load.pending_tokens,
            "engine_load": engine_load}


def _usable(endpoints: Sequence[Endpoint], loads: Mapping[str, EndpointLoad]) -> int:
    return sum(1 for e in endpoints if (loads.get(e.name) or EndpointLoad()).healthy)


def _shortage(name: str, endpoints: Sequence[Endpoint]) -> str:
    if not endpoints:
        return f"no {name} pod discovered"
    return f"no usable {name} pod ({len(endpoints)} discovered, all ejected after failures or draining)"


def readiness(membership: Membership, loads: Mapping[str, EndpointLoad]) -> tuple[bool, str]:
    """(ready, reason): ready when at least one prefill pod (either group: a class whose group
    is empty falls back to the other) and one decode pod are discovered and not ejected."""
    prefill = [e for group in CLASSES for e in membership.groups.get(group, ())]
    missing = [_shortage(name, pods) for name, pods in (("prefill", prefill), ("decode", membership.decode))
               if not _usable(pods, loads)]
    return (not missing), "; ".join(missing)


def _decode(gateway: Gateway, membership: Membership, loads: Mapping[str, EndpointLoad]) -> dict:
    """`slots`: the routable pods' reported max running requests; `max_held_per_class`: the
    decode share's bound (None: none); `held`: the requests there per class, as admission counts
    them (every gateway replica's, where the engines report classes; this gateway's without those
    queued for a prefill predicted to end after the class's answers lately left: admission.py
    rule 3); `held_here`: this gateway's own, dispatch to last byte."""
    engine_loads, tracker = gateway.proxy.engine_loads, gateway.tracker
    slots = decode_slots(membership.decode, loads, engine_loads.slots)
    return {"pods": [_pod(e, loads.get(e.name), engine_loads.report(e.name)) for e in membership.decode],
            "slots": slots, "max_held_per_class": decode_share_bound(gateway.config.max_decode_share, slots),
            "held": {cls: decode_held(membership.decode, loads, cls, tracker.decode_share_held(cls),
                                      engine_loads.others_held) for cls in CLASSES},
            "held_here": {cls: tracker.decode_held(cls) for cls in CLASSES}}


def laps_status(gateway: Gateway) -> dict:
    membership = gateway.discovery.membership()
    loads = gateway.tracker.loads()
    reports = gateway.proxy.engine_loads.report
    groups = {}
    for group in CLASSES:
        requests, tokens = gateway.tracker.group_pending(group)
        pods = membership.groups.get(group, ())
        groups[group] = {"pods": [_pod(e, loads.get(e.name), reports(e.name)) for e in pods],
                         "pending_requests": requests, "pending_tokens": tokens,
                         "max_pending_tokens": group_bound(
                             gateway.config.max_pending_tokens_per_pod, _usable(pods, loads))}
    allocation = gateway.allocator.status() if gateway.allocator is not None else {"enabled": False}
    limit = engines_limit(membership, gateway.proxy.engine_loads.max_prompt_tokens)
    return {"enabled": True, "served_model_name": gateway.config.served_model_name,
            "threshold": gateway.config.length_threshold, "groups": groups,
            # Longer prompts (counted exactly) are refused here, before admission (context.py).
            "max_prompt_tokens": limit.tokens if limit is not None else None,
            "decode": _decode(gateway, membership, loads),
            "allocation": allocation,
            "autoscaling": gateway.planner.status() if gateway.planner is not None else {"enabled": False}}
