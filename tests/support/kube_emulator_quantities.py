"""Resource quantities stored the way kube-apiserver stores them: canonicalised.

A real API server parses every quantity of a pod (template) and serialises it back in its
canonical form, so `cpu: 1000m` reads back as "1" and `memory: 2048Mi` as "2Gi"; a client that
compares what it sent with what it reads must compare quantities by value. The rules here are
Kubernetes' (resource.Quantity.String) for the common forms: binary suffixes stay binary (the
largest exact suffix) when the value is a whole number of at least 1024, everything else becomes
decimal SI with the largest suffix that leaves a whole mantissa; exponent forms ("1e3") are
left as sent.
"""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import kmock
from kubernetes.utils.quantity import parse_quantity

_BINARY = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))
_DECIMAL = (("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3), ("", 0), ("m", -3), ("u", -6),
            ("n", -9))
_EXPONENT = re.compile(r"[+-]?[0-9.]+[eE][+-]?[0-9]+")
# Built-in kinds whose objects hold pod specs (and so container resources).
WORKLOADS = [kmock.resource("", "v1", "pods")] + [
    kmock.resource("apps", "v1", plural) for plural in ("deployments", "statefulsets", "replicasets", "daemonsets")]


def canonical(value: Any) -> Any:
    text = str(value)
    if _EXPONENT.fullmatch(text):
        return value
    try:
        amount = parse_quantity(text)
    except ValueError:
        return value   # validation is not emulated; leave what is not a quantity alone
    whole = amount == amount.to_integral_value()
    if text.endswith(tuple(s for s, _ in _BINARY)) and whole and amount >= 1024:
        for suffix, power in _BINARY:
            if amount % (1 << power) == 0:
                return f"{int(amount) >> power}{suffix}"
        return str(int(amount))
    if amount == 0:
        return "0"
    for suffix, exponent in _DECIMAL:
        mantissa = amount / (Decimal(10) ** exponent)
        if mantissa == mantissa.to_integral_value():
            return f"{int(mantissa)}{suffix}"
    return f"{int((amount * Decimal(10) ** 9).to_integral_value(rounding='ROUND_CEILING'))}n"


def _canonical_pod_spec(pod_spec: Any) -> None:
    if not isinstance(pod_spec, dict):
        return
    for key in ("containers", "initContainers"):
        for container in pod_spec.get(key) or ():
            resources = container.get("resources") if isinstance(container, dict) else None
            for part in ("requests", "limits"):
                if isinstance(resources, dict) and isinstance(resources.get(part), dict):
                    resources[part] = {k: canonical(v) for k, v in resources[part].items()}
    if isinstance(pod_spec.get("overhead"), dict):
        pod_spec["overhead"] = {k: canonical(v) for k, v in pod_spec["overhead"].items()}


def canonicalise_workload(obj: dict) -> None:
    """In place, before the object is stored (a `store.validators` hook)."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    if obj.get("kind") == "Pod":
        _canonical_pod_spec(spec)
    else:
        _canonical_pod_spec((spec.get("template") or {}).get("spec"))
