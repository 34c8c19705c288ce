"""Pure builders: a LAPSCluster's typed spec -> the manifests of its children.

Every manifest carries the architecture's labels and an owner reference to the cluster, so a
reconcile is "apply each of these" and deletion is the garbage collector's job. The pod-running
children (engines, gateway) are shaped in workloads.py; this module builds the rest and
assembles them all.
"""
from __future__ import annotations

import json
from typing import Any

from laps_agent.policy.classes import CLASSES
from laps_operator.naming import (
    BOOTSTRAP_PORT,
    CLUSTER_LABEL,
    ENGINE_PORT,
    GROUP_LABEL,
    ROLE_LABEL,
    ClusterRef,
    role_selector,
)
from laps_operator.naming import object_meta as _meta
from laps_operator.render.network_policy import build_network_policies, network_policy_refs
from laps_operator.render.workloads import build_decode_deployment, build_gateway_deployment, build_prefill_statefulset
from laps_operator.spec.cluster import ClusterSpec


def _service(cluster: ClusterRef, name: str, component: str, selector: dict, ports: list[dict],
             **spec_extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(cluster, name, component),
        "spec": {"selector": selector, "ports": ports, **spec_extra},
    }


def _engine_ports(with_bootstrap: bool) -> list[dict]:
    ports = [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}]
    if with_bootstrap:
        ports.append({"name": "bootstrap", "port": BOOTSTRAP_PORT, "targetPort": "bootstrap", "protocol": "TCP"})
    return ports


def build_services(cluster: ClusterRef, spec: ClusterSpec) -> list[dict[str, Any]]:
    prefill = role_selector(cluster.name, "prefill")
    services = [
        # Headless: stable DNS per prefill pod, ready or not (bootstrap addresses are per pod).
        _service(cluster, cluster.prefill, "prefill", prefill, _engine_ports(True),
                 clusterIP="None", publishNotReadyAddresses=True),
    ]
    for group in CLASSES:
        services.append(_service(cluster, cluster.prefill_group_service(group), "prefill",
                                 {**prefill, GROUP_LABEL: group}, _engine_ports(True)))
    services.append(_service(cluster, cluster.decode, "decode", role_selector(cluster.name, "decode"),
                             _engine_ports(False)))
    gateway_ports = [{"name": "http", "port": spec.gateway.port, "targetPort": "http", "protocol": "TCP"}]
    gateway = _service(cluster, cluster.gateway, "gateway", role_selector(cluster.name, "gateway"),
                       gateway_ports, type=spec.gateway.service_type)
    if spec.gateway.service_annotations:
        # On the Service alone (a cloud's load balancer reads them there): no pod restarts.
        gateway["metadata"]["annotations"] = dict(spec.gateway.service_annotations)
    services.append(gateway)
    return services


def build_gateway_rbac(cluster: ClusterRef, spec: ClusterSpec) -> list[dict[str, Any]]:
    """ServiceAccount + Role + RoleBinding letting the gateway discover engines (EndpointSlices)."""
    name = cluster.gateway
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cluster, name, "gateway")},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(cluster, name, "gateway"),
            # Exactly what discovery uses (list, then watch from that list's resourceVersion):
            # the least-privilege e2e test compares this with what the gateway really asks for.
            "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                       "verbs": ["list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(cluster, name, "gateway"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cluster.namespace}],
        },
    ]


def build_config_map(cluster: ClusterRef, spec: ClusterSpec) -> dict[str, Any]:
    """The effective (defaulted) LAPS configuration, for humans and the allocation loop."""
    config = {
        "cluster": cluster.name,
        "services": {
            "prefill": cluster.prefill,
            "prefillShort": cluster.prefill_group_service("short"),
            "prefillLong": cluster.prefill_group_service("long"),
            "decode": cluster.decode,
            "gateway": cluster.gateway,
        },
        "laps": spec.laps.model_dump(mode="json", by_alias=True),
        "monitoring": spec.monitoring.model_dump(mode="json", by_alias=True),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cluster, cluster.config, "config"),
        "data": {"laps.json": json.dumps(config, indent=2, sort_keys=True)},
    }


def build_pod_monitor(cluster: ClusterRef, spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(cluster, cluster.name, "config"),
        "spec": {
            "selector": {"matchLabels": {CLUSTER_LABEL: cluster.name}},
            # The allocation loop averages the gateways' pending work over its interval: scrape
            # at least twice per interval (scrape_interval_seconds).
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": _scrape_interval(spec)}],
            # Pods carry their role and group; keep them on the series for per-group dashboards.
            "podTargetLabels": [ROLE_LABEL, GROUP_LABEL],
        },
    }


def scrape_interval_seconds(interval_s: float) -> float:
    """How often the rendered PodMonitor scrapes: twice per allocation interval, between 1 s and
    15 s (the allocation loop's window, allocation.pressure.window_seconds, spans two scrapes)."""
    return min(15.0, max(1.0, float(interval_s) / 2))


def _scrape_interval(spec: ClusterSpec) -> str:
    alloc = spec.laps.allocation
    if not alloc.enabled:
        return "15s"
    ms = int(round(scrape_interval_seconds(alloc.interval_seconds) * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def build_children(cluster: ClusterRef, spec: ClusterSpec,
                   operator_namespace: str | None = None) -> list[dict[str, Any]]:
    """Everything the cluster should own, in creation order (config and RBAC before workloads).
    `operator_namespace`: where the operator runs, the only namespace its pods are let in from."""
    children = [build_config_map(cluster, spec), *build_gateway_rbac(cluster, spec)]
    children += build_services(cluster, spec)
    if spec.network_policy.enabled:  # before the pods they guard: never a moment unguarded
        children += build_network_policies(cluster, spec, operator_namespace)
    children += [
        build_prefill_statefulset(cluster, spec),
        build_decode_deployment(cluster, spec),
        build_gateway_deployment(cluster, spec),
    ]
    if spec.monitoring.pod_monitor:
        children.append(build_pod_monitor(cluster, spec))
    return children


def optional_children(cluster: ClusterRef, spec: ClusterSpec) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of children that exist only for some specs and must be removed
    when the spec no longer asks for them."""
    unwanted = [] if spec.monitoring.pod_monitor else [("monitoring.coreos.com/v1", "PodMonitor", cluster.name)]
    if not spec.network_policy.enabled:
        unwanted += network_policy_refs(cluster)
    return unwanted
