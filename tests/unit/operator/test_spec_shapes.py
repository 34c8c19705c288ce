"""Kubernetes shapes a LAPSCluster embeds (NetworkPolicyPeers, label selectors, the model volume):
a misspelt or missing key is refused, by the CRD or as InvalidSpec naming the field, never
passed on for the API server to drop into a selector of everything or an empty volume."""
from __future__ import annotations

import copy
import json
import pathlib

import kubernetes_validate
import pytest

from laps_operator.naming import ClusterRef
from laps_operator.render.builders import build_children
from laps_operator.spec.cluster import InvalidSpecError, parse_spec
from laps_operator.spec.pods import VOLUME_SOURCES
from tests.support.kube_emulator_schema import object_checker
from tests.unit.operator.crd_jsonschema import errors, load_crd, openapi_schema

SCHEMA = openapi_schema(load_crd())
MINIMAL = {"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster", "metadata": {"name": "c"},
           "spec": {"model": {"name": "m", "path": "/models/m"}}}


def cr(**spec: object) -> dict:
    doc = copy.deepcopy(MINIMAL)
    doc["spec"].update(copy.deepcopy(spec))
    return doc


def stored_spec(doc: dict) -> dict:
    """The spec as the API server stores it: pruned and defaulted by the CRD's schema."""
    doc = copy.deepcopy(doc)
    object_checker(SCHEMA)(doc)
    return doc["spec"]


def policies(spec: dict) -> dict[str, dict]:
    children = build_children(ClusterRef("c", "serving", "uid-1"), parse_spec(spec))
    return {c["metadata"]["name"]: c for c in children if c["kind"] == "NetworkPolicy"}


MISSPELT_SELECTORS = [
    ({"networkPolicy": {"gatewayIngress": [{"namespaceSelector": {"matchLable": {"team": "a"}}}]}},
     "spec.networkPolicy.gatewayIngress.0.namespaceSelector.matchLable"),
    ({"networkPolicy": {"metricsFrom": [{"podSelector": {"matchLabels": {"app": "p"}, "matchExpresions": []}}]}},
     "spec.networkPolicy.metricsFrom.0.podSelector.matchExpresions"),
    ({"prefill": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabel": {"laps.io/role": "prefill"}}, "topologyKey": "kubernetes.io/hostname"}]}}}},
     "spec.prefill.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution.0.labelSelector.matchLabel"),
    ({"gateway": {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": {"namespaceSelector": {"matchLabelz": {}}, "topologyKey": "zone"}}]}}}},
     "spec.gateway.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution.0.podAffinityTerm."
     "namespaceSelector.matchLabelz"),
]


@pytest.mark.parametrize(("spec", "field"), MISSPELT_SELECTORS, ids=[f for _, f in MISSPELT_SELECTORS])
def test_a_misspelt_selector_key_survives_the_api_server_and_is_an_invalid_spec_naming_it(spec, field):
    # The API server would drop the key from the NetworkPolicy or the pod template, leaving {}:
    # every namespace (port 30000 past the gateway's API keys) or every pod. The CRD keeps it
    # (pruning it would leave the same {}), so the operator sees it and refuses.
    stored = stored_spec(cr(**spec))
    with pytest.raises(InvalidSpecError, match=rf"{field.replace('.', '[.]')}: Extra inputs are not permitted"):
        parse_spec(stored)


BAD_SELECTORS = [
    ({"matchExpressions": [{"key": "team", "operator": "Within", "values": ["a"]}]}, "matchExpressions.0.operator",
     "'Within' is not one of"),
    ({"matchLabels": {"team": 1}}, "matchLabels.team", "is not of type 'string'"),
    ({"matchExpressions": [{"operator": "Exists"}]}, "matchExpressions.0", "'key' is a required property"),
]


@pytest.mark.parametrize(("selector", "where", "says"), BAD_SELECTORS, ids=[s for _, _, s in BAD_SELECTORS])
def test_the_crd_types_peer_selectors_as_label_selectors(selector, where, says):
    doc = cr(networkPolicy={"gatewayIngress": [{"namespaceSelector": selector}]})
    found = errors(doc)
    prefix = "spec.networkPolicy.gatewayIngress.0.namespaceSelector."
    assert any(e.startswith(prefix + where + ":") and says in e for e in found), found
    with pytest.raises(InvalidSpecError, match=r"spec\.networkPolicy\.gatewayIngress\.0\.namespaceSelector"):
        parse_spec(doc["spec"])


INVALID_PEERS = [
    ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}, "operator In needs values"),
    ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}},
     "operator Exists takes no values"),
    # The CRD prunes the misspelt `valeus`: what is left is refused, not an expression of nothing.
    ({"podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "valeus": ["x"]}]}},
     "operator NotIn needs values"),
    ({"ipBlock": {"cidr": "10.0.0.0"}}, "'10.0.0.0' is not a CIDR"),
    ({"ipBlock": {"cidr": "10.0.0.0/33"}}, "'10.0.0.0/33' is not a CIDR"),
    ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}}, "except: 192.168.0.0/16 is not a strict part"),
    ({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}, "except: 10.0.0.0/8 is not a strict part"),
    ({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}, "ipBlock goes alone"),
]


@pytest.mark.parametrize(("peer", "says"), INVALID_PEERS, ids=[s for _, s in INVALID_PEERS])
def test_peers_the_api_server_would_refuse_are_an_invalid_spec_naming_the_peer(peer, says):
    for field in ("gatewayIngress", "metricsFrom"):
        spec = stored_spec(cr(networkPolicy={field: [peer]}))
        with pytest.raises(InvalidSpecError, match=rf"spec\.networkPolicy\.{field}\.0.*{says}"):
            parse_spec(spec)


def test_valid_peers_reach_the_network_policies_as_written():
    ingress = [
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
         "podSelector": {}},
        {"ipBlock": {"cidr": "10.1.2.3/16", "except": ["10.1.128.0/17"]}},
    ]
    metrics = [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "vm"}}}]
    spec = stored_spec(cr(networkPolicy={"gatewayIngress": ingress, "metricsFrom": metrics},
                          monitoring={"prometheusURL": "http://prom:9090"}))
    built = policies(spec)
    assert built["c-gateway"]["spec"]["ingress"][0]["from"] == ingress + metrics
    assert built["c-decode"]["spec"]["ingress"][-1]["from"] == metrics
    # The CRD's default peer renders as before: Prometheus pods in any namespace.
    default = policies(stored_spec(MINIMAL))["c-prefill"]["spec"]["ingress"][-1]["from"]
    assert default == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]


def test_a_checked_affinity_term_keeps_its_other_fields():
    term = {"labelSelector": {"matchLabels": {"laps.io/role": "prefill"}}, "topologyKey": "kubernetes.io/hostname",
            "namespaces": ["serving"], "matchLabelKeys": ["pod-template-hash"]}
    spec = stored_spec(cr(prefill={"affinity": {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": term}]}}}))
    children = build_children(ClusterRef("c", "serving", "uid-1"), parse_spec(spec))
    prefill = next(c for c in children if c["kind"] == "StatefulSet")
    anti = prefill["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti == {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": term}]}


BAD_VOLUMES = [
    ({"persistentVolumeClam": {"claimName": "models"}}, "persistentVolumeClam: not a Kubernetes volume source"),
    ({"name": "weights"}, "needs exactly one volume source"),
    ({"nfs": {"server": "n", "path": "/m"}, "persistentVolumeClaim": {"claimName": "models"}},
     "needs exactly one volume source"),
    ({"persistentVolumeClaim": "models"}, "persistentVolumeClaim must be an object"),
]


@pytest.mark.parametrize(("volume", "says"), BAD_VOLUMES, ids=[s for _, s in BAD_VOLUMES])
def test_a_model_volume_without_exactly_one_known_source_is_an_invalid_spec(volume, says):
    # The API server would make it an emptyDir: engines on an empty /models, crash-looping.
    spec = stored_spec(cr(model={"name": "m", "path": "/models/m", "volume": volume}))
    with pytest.raises(InvalidSpecError, match=rf"spec\.model\.volume: .*{says}"):
        parse_spec(spec)


def test_an_empty_model_volume_is_refused_by_the_crd_and_the_operator():
    doc = cr(model={"name": "m", "path": "/models/m", "volume": {}})
    assert any(e.startswith("spec.model.volume:") for e in errors(doc)), errors(doc)
    with pytest.raises(InvalidSpecError, match=r"spec\.model\.volume: needs exactly one volume source"):
        parse_spec(doc["spec"])


def test_the_volume_sources_are_kubernetes_1_37s():
    path = (pathlib.Path(kubernetes_validate.__file__).parent
            / "kubernetes-json-schema" / "v1.37.0-local-strict" / "volume-v1.json")
    sources = json.loads(path.read_text())["properties"]
    definitions = json.loads((path.parent / "_definitions.json").read_text())["$defs"]
    assert set(VOLUME_SOURCES) == set(sources) - {"name"}
    for source, required in VOLUME_SOURCES.items():
        assert required == tuple(definitions[sources[source]["$ref"].split("/")[-1]].get("required", ()))
    given = {"persistentVolumeClaim": {"claimName": "models"}, "nfs": {"server": "nas", "path": "/m"},
             "csi": {"driver": "d"}, "hostPath": {"path": "/m"}, "ephemeral": {}}
    for source, fields in given.items():
        spec = cr(model={"name": "m", "path": "/models/m", "volume": {source: fields}})
        assert parse_spec(spec["spec"]).model.volume == {source: fields}
    # A source missing what its schema requires (a typo in it) is named, not refused by the API
    # server on every write of the workloads.
    with pytest.raises(InvalidSpecError, match=r"spec.model.volume: persistentVolumeClaim needs claimName"):
        parse_spec(cr(model={"name": "m", "path": "/m", "volume": {"persistentVolumeClaim": {"claimNam": "m"}}})["spec"])
    with pytest.raises(InvalidSpecError, match=r"spec.model.volume: nfs needs path"):
        parse_spec(cr(model={"name": "m", "path": "/m", "volume": {"nfs": {"server": "nas"}}})["spec"])
