"""NetworkPolicies: which pods each selects, and which peers reach which ports."""
from __future__ import annotations

import pytest

from laps_operator.naming import ClusterRef
from laps_operator.render.builders import build_children, optional_children
from laps_operator.render.network_policy import build_network_policies
from laps_operator.spec.cluster import InvalidSpecError, parse_spec

CLUSTER = ClusterRef("demo", "serving", "0b7c-uid")
BASE = {"model": {"name": "m", "path": "/m"}}
PROMETHEUS = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
OPERATOR = {"namespaceSelector": {},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "laps", "app.kubernetes.io/component": "operator"}}}


def policies(**overrides) -> dict[str, dict]:
    built = build_network_policies(CLUSTER, parse_spec({**BASE, **overrides}))
    return {p["metadata"]["labels"]["laps.io/role"]: p for p in built}


def ports(rule: dict) -> set[int | str] | None:
    return None if "ports" not in rule else {p["port"] for p in rule["ports"]}


def admitted(policy: dict, port: int | str) -> list[dict] | None:
    """The peers allowed to `port`, a number or a container port's name (None: every source)."""
    peers = []
    for rule in policy["spec"]["ingress"]:
        if ports(rule) is None or port in ports(rule):
            if "from" not in rule:
                return None
            peers += rule["from"]
    return peers


def own_pods(*roles: str) -> dict:
    return {"podSelector": {"matchLabels": {"laps.io/cluster": "demo"},
                            "matchExpressions": [{"key": "laps.io/role", "operator": "In", "values": list(roles)}]}}


def test_one_ingress_policy_per_role_selecting_exactly_its_pods():
    built = policies()
    assert set(built) == {"prefill", "decode", "gateway"}
    for role, policy in built.items():
        assert policy["metadata"]["name"] == f"demo-{role}"
        assert policy["metadata"]["namespace"] == "serving"
        assert policy["spec"]["podSelector"] == {"matchLabels": {"laps.io/cluster": "demo", "laps.io/role": role}}
        assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open (DNS, API server)


def test_engine_ports_admit_only_the_clusters_gateway_and_engines_plus_prometheus():
    built = policies()
    engines = own_pods("gateway", "prefill", "decode")
    assert admitted(built["prefill"], 8998) == [engines]
    assert admitted(built["prefill"], 30000) == [engines, PROMETHEUS]
    assert admitted(built["decode"], 30000) == [engines, PROMETHEUS]
    assert admitted(built["decode"], 8998) == []   # decode has no bootstrap port to open
    assert admitted(built["prefill"], 22) == []


def test_sglang_engines_reach_each_other_on_every_port_for_kv_transfer():
    built = policies(engine={"backend": "sglang"})
    for role in ("prefill", "decode"):
        assert admitted(built[role], 17000) == [own_pods("prefill", "decode")]
    assert own_pods("gateway", "prefill", "decode") not in admitted(built["prefill"], 17000)


def test_gateway_is_open_on_its_port_only_by_default():
    spec = {**BASE, "gateway": {"port": 8080}}
    gateway = policies(gateway={"port": 8080})["gateway"]
    # A policy sees the pods' port, the one the container listens on, not the Service's 8080.
    # By the port's name: new pods listen on 8000, pods of an older operator still rolling out
    # on 8080, and the policy, applied first, must shut off neither.
    deployment = next(c for c in build_children(CLUSTER, parse_spec(spec)) if c["metadata"]["name"] == "demo-gateway"
                      and c["kind"] == "Deployment")
    (pod_port,) = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert admitted(gateway, pod_port["name"]) is None
    assert pod_port["containerPort"] == 8000
    assert admitted(gateway, 30000) == []


def test_gateway_ingress_restricts_the_gateway_and_keeps_metrics_and_the_operator_in():
    ingress = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    gateway = policies(networkPolicy={"gatewayIngress": [ingress]})["gateway"]
    assert admitted(gateway, "http") == [ingress, PROMETHEUS, OPERATOR]
    # With Prometheus the operator reads pressure from it, not from the gateways.
    gateway = policies(networkPolicy={"gatewayIngress": [ingress]},
                       monitoring={"prometheusURL": "http://prometheus:9090"})["gateway"]
    assert admitted(gateway, "http") == [ingress, PROMETHEUS]


def test_the_operator_is_let_in_from_its_own_namespace_only_when_it_knows_it():
    ingress = {"podSelector": {"matchLabels": {"app": "edge"}}}
    spec = parse_spec({**BASE, "networkPolicy": {"gatewayIngress": [ingress]}})
    gateway = build_network_policies(CLUSTER, spec, operator_namespace="laps-system")[-1]
    assert admitted(gateway, "http")[-1] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "laps-system"}},
        "podSelector": OPERATOR["podSelector"]}


def test_metrics_from_replaces_the_prometheus_default():
    scraper = {"ipBlock": {"cidr": "10.1.0.0/16"}}
    built = policies(networkPolicy={"metricsFrom": [scraper]})
    assert admitted(built["decode"], 30000) == [own_pods("gateway", "prefill", "decode"), scraper]
    none = policies(networkPolicy={"metricsFrom": []})
    assert admitted(none["decode"], 30000) == [own_pods("gateway", "prefill", "decode")]


def test_disabled_policies_are_not_built_and_are_pruned():
    spec = parse_spec({**BASE, "networkPolicy": {"enabled": False}})
    assert "NetworkPolicy" not in {c["kind"] for c in build_children(CLUSTER, spec)}
    pruned = {(kind, name) for _, kind, name in optional_children(CLUSTER, spec)}
    assert {("NetworkPolicy", f"demo-{r}") for r in ("prefill", "decode", "gateway")} <= pruned
    on = parse_spec(BASE)
    assert [c for c in build_children(CLUSTER, on) if c["kind"] == "NetworkPolicy"]
    assert not [k for _, k, _ in optional_children(CLUSTER, on) if k == "NetworkPolicy"]


@pytest.mark.parametrize("peer", [{}, {"pods": {}}])
def test_a_peer_that_selects_nothing_is_a_readable_error(peer):
    with pytest.raises(InvalidSpecError, match="spec.networkPolicy.gatewayIngress"):
        parse_spec({**BASE, "networkPolicy": {"gatewayIngress": [peer]}})
