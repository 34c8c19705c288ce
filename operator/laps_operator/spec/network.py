"""spec.networkPolicy of a LAPSCluster: the NetworkPolicyPeers admitted to the gateway and to
/metrics, checked as the API server checks a NetworkPolicy's and stricter on selectors: it drops
a misspelt selector key, and the {} left selects every pod or namespace, opening the port (the
engines' one bypasses the gateway's API keys).
"""
from __future__ import annotations

import ipaddress
from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

from laps_operator.spec.placement import LabelSelector, SpecModel


def _cidr(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    # As the API server: an address/prefix, host bits allowed (10.0.0.1/8 is 10.0.0.0/8).
    if "/" not in value:
        raise ValueError(f"{value!r} is not a CIDR (address/prefix length, e.g. 10.0.0.0/8)")
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(f"{value!r} is not a CIDR (address/prefix length, e.g. 10.0.0.0/8)") from None


# The CRD's format; _cidr says what is wrong with one.
Cidr = Annotated[str, Field(json_schema_extra={"format": "cidr"})]


class IPBlock(SpecModel):
    cidr: Cidr
    except_: tuple[Cidr, ...] | None = Field(default=None, alias="except")

    @model_validator(mode="after")
    def _networks(self) -> IPBlock:
        net = _cidr(self.cidr)
        for value in self.except_ or ():
            inner = _cidr(value)
            # The API server's rule: each exception a strict part of cidr.
            if inner.version != net.version or not inner.subnet_of(net) or inner == net:
                raise ValueError(f"except: {value} is not a strict part of cidr {self.cidr}")
        return self


class NetworkPolicyPeer(SpecModel):
    model_config = ConfigDict(json_schema_extra={"description": "a NetworkPolicyPeer (networking.k8s.io/v1)",
                                                 "minProperties": 1})
    pod_selector: LabelSelector | None = Field(
        default=None, description="a LabelSelector (matchLabels, matchExpressions); {} = every pod")
    namespace_selector: LabelSelector | None = Field(
        default=None, description="a LabelSelector (matchLabels, matchExpressions); {} = every namespace")
    ip_block: IPBlock | None = Field(default=None, description="alone in its peer; except = parts of cidr left out")

    @model_validator(mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        # The API server refuses a peer without any of them.
        if isinstance(value, dict) and not value:
            raise ValueError("needs one or more of podSelector, namespaceSelector, ipBlock")
        return value

    @model_validator(mode="after")
    def _ip_block_alone(self) -> NetworkPolicyPeer:
        if self.ip_block is not None and (self.pod_selector is not None or self.namespace_selector is not None):
            raise ValueError("ipBlock goes alone: a peer with it takes no podSelector or namespaceSelector")
        return self

    def manifest(self) -> dict[str, Any]:
        """The peer as a NetworkPolicy takes it (`{}` selectors kept: they select everything)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# Prometheus Operator's Prometheus pods carry this label (kube-prometheus-stack included); any
# namespace, since Prometheus usually runs in its own.
PROMETHEUS_PEER = NetworkPolicyPeer.model_validate({
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
})


class NetworkPolicySpec(SpecModel):
    enabled: bool = Field(default=True, description="create the NetworkPolicies (false deletes them)")
    # Empty: from anywhere (the gateway is the cluster's front door, and a LoadBalancer/NodePort's
    # clients have no in-cluster labels).
    gateway_ingress: tuple[NetworkPolicyPeer, ...] = Field(
        default=(),
        description="peers allowed to the gateway's port; empty = from anywhere (the front door: a LoadBalancer's "
                    "or NodePort's clients carry no in-cluster labels). When set, metricsFrom and, without "
                    "monitoring.prometheusURL, the operator's pods are added to it")
    metrics_from: tuple[NetworkPolicyPeer, ...] = Field(
        default=(PROMETHEUS_PEER,),
        description="peers allowed to the engines' and gateway's HTTP ports for /metrics; default: Prometheus "
                    "Operator's Prometheus pods (app.kubernetes.io/name=prometheus) in any namespace; [] = none")
