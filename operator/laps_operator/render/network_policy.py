"""NetworkPolicies around a cluster's pods (spec.networkPolicy): who may connect to what.

One policy per role, ingress only (egress is left open: engines fetch from each other, the
gateway reaches the API server and the engines, and DNS must work):

- prefill: its `http` and `bootstrap` ports from the cluster's own gateway and engine pods;
- decode: its `http` port from the same pods;
- gateway: its pods' `http` port (naming.GATEWAY_PORT, whatever the Service's) from
  spec.networkPolicy.gatewayIngress (empty: from anywhere);
- the HTTP ports (engines' and gateway's, where /metrics is served) also from
  spec.networkPolicy.metricsFrom, and the gateway's from the operator when it reads the
  gateways' /metrics itself (no monitoring.prometheusURL: pressure.scrape_gateways).

Kubelet probes come from the node, which the common CNIs (Calico, Cilium) always admit.
"""
from __future__ import annotations

from typing import Any

from laps_operator.naming import (
    BOOTSTRAP_PORT,
    CLUSTER_LABEL,
    ENGINE_PORT,
    HTTP_PORT_NAME,
    OPERATOR_POD_LABELS,
    ROLE_LABEL,
    ClusterRef,
    object_meta,
    role_selector,
)
from laps_operator.spec.cluster import ClusterSpec
from laps_operator.spec.network import NetworkPolicyPeer

ENGINE_ROLES = ("prefill", "decode")
API_VERSION = "networking.k8s.io/v1"


def _ports(*numbers: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": n} for n in numbers]


def _cluster_pods(cluster: ClusterRef, roles: tuple[str, ...]) -> dict[str, Any]:
    """A peer: this cluster's pods of `roles`, in the cluster's namespace (a podSelector alone
    never matches pods of other namespaces)."""
    return {"podSelector": {
        "matchLabels": {CLUSTER_LABEL: cluster.name},
        "matchExpressions": [{"key": ROLE_LABEL, "operator": "In", "values": list(roles)}],
    }}


def operator_peer(operator_namespace: str | None) -> dict[str, Any]:
    """The operator's pods, in its own namespace (the chart tells it: $POD_NAMESPACE); in any
    namespace when it does not know its own (run outside a pod)."""
    namespaces = ({"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}}
                  if operator_namespace else {})
    return {"namespaceSelector": namespaces, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}


def _peers(peers: tuple[NetworkPolicyPeer, ...]) -> list[dict[str, Any]]:
    return [peer.manifest() for peer in peers]


def _policy(cluster: ClusterRef, role: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": object_meta(cluster, cluster.network_policy(role), role),
        "spec": {
            "podSelector": {"matchLabels": role_selector(cluster.name, role)},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def _engine_rules(cluster: ClusterRef, spec: ClusterSpec, role: str) -> list[dict[str, Any]]:
    ports = (ENGINE_PORT, BOOTSTRAP_PORT) if role == "prefill" else (ENGINE_PORT,)
    rules = [{"from": [_cluster_pods(cluster, ("gateway", *ENGINE_ROLES))], "ports": _ports(*ports)}]
    if spec.engine.backend == "sglang":
        # SGLang's KV transfer (Mooncake/NIXL and their ZMQ sockets) listens on ports it picks
        # at start-up, on prefill and decode alike: engine to engine, every port.
        rules.append({"from": [_cluster_pods(cluster, ENGINE_ROLES)]})
    if spec.network_policy.metrics_from:
        rules.append({"from": _peers(spec.network_policy.metrics_from), "ports": _ports(ENGINE_PORT)})
    return rules


def _gateway_rules(spec: ClusterSpec, operator_namespace: str | None) -> list[dict[str, Any]]:
    policy = spec.network_policy
    # The pods' port, by its name: a policy never sees the Service's gateway.port, and the name
    # also covers gateway pods of an older operator, which listened on gateway.port itself, so
    # the policy applied before their rollout ends does not shut them off.
    port = [{"protocol": "TCP", "port": HTTP_PORT_NAME}]
    if not policy.gateway_ingress:
        return [{"ports": port}]  # no `from`: every source, on this port only
    peers = _peers((*policy.gateway_ingress, *policy.metrics_from))
    if not spec.monitoring.prometheus_url:
        peers.append(operator_peer(operator_namespace))
    return [{"from": peers, "ports": port}]


def build_network_policies(cluster: ClusterRef, spec: ClusterSpec,
                           operator_namespace: str | None = None) -> list[dict[str, Any]]:
    return [
        *(_policy(cluster, role, _engine_rules(cluster, spec, role)) for role in ENGINE_ROLES),
        _policy(cluster, "gateway", _gateway_rules(spec, operator_namespace)),
    ]


def network_policy_refs(cluster: ClusterRef) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every policy build_network_policies makes, for pruning."""
    return [(API_VERSION, "NetworkPolicy", cluster.network_policy(role)) for role in (*ENGINE_ROLES, "gateway")]
