"""What platform teams set on the pods and the gateway Service beside the operator: Service
annotations (an internal load balancer), pod labels and annotations, a PriorityClass and topology
spread constraints per role; keys the operator sets are refused, naming the key and why."""
from __future__ import annotations

import re

import kubernetes_validate
import pytest

from laps_operator.render.builders import build_children, build_services
from laps_operator.spec.cluster import InvalidSpecError
from laps_operator.spec.formats import (
    ANNOTATIONS_MAX_BYTES,
    DNS_SUBDOMAIN_PATTERN,
    LABEL_VALUE_MAX_LENGTH,
    LABEL_VALUE_PATTERN,
)
from tests.unit.operator.crd_jsonschema import apply_defaults, errors
from tests.unit.operator.test_builders import CLUSTER, spec_of
from tests.unit.operator.test_builders_placement import pods
from tests.unit.operator.test_crd import SCHEMA, with_spec

ROLES = ("prefill", "decode", "gateway")
INTERNAL_LB = {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
               "networking.gke.io/load-balancer-type": "Internal"}
ZONES = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
         "minDomains": 2}


def parsed(**spec: object):
    """The spec as the API server would store it (the CRD's schema checked, defaults applied),
    then parsed by the operator."""
    doc = with_spec(**spec)
    assert errors(doc) == []
    return spec_of(**apply_defaults(doc, SCHEMA)["spec"])


def gateway_service(spec) -> dict:
    return next(s for s in build_services(CLUSTER, spec) if s["metadata"]["name"] == "demo-gateway")


def templates(spec) -> dict[str, dict]:
    return {c["metadata"]["name"]: c["spec"]["template"] for c in build_children(CLUSTER, spec)
            if c["kind"] in ("StatefulSet", "Deployment")}


def test_service_annotations_ask_for_an_internal_load_balancer_and_restart_no_pod():
    spec = parsed(gateway={"serviceType": "LoadBalancer", "serviceAnnotations": INTERNAL_LB})
    service = gateway_service(spec)
    assert service["spec"]["type"] == "LoadBalancer" and service["metadata"]["annotations"] == INTERNAL_LB
    kubernetes_validate.validate(service, "1.37", strict=True)
    # The engines' Services and every pod are as without them: the edit rolls nothing.
    plain = parsed(gateway={"serviceType": "LoadBalancer"})
    assert "annotations" not in gateway_service(plain)["metadata"]
    others = [s for s in build_services(CLUSTER, spec) if s["metadata"]["name"] != "demo-gateway"]
    assert others == [s for s in build_services(CLUSTER, plain) if s["metadata"]["name"] != "demo-gateway"]
    assert templates(spec) == templates(plain)


def test_each_role_gets_its_own_pod_labels_annotations_and_priority_beside_the_operators_labels():
    spec = parsed(
        prefill={"podLabels": {"team": "ml", "cost-center": "llm-7"}, "priorityClassName": "gpu-serving",
                 "podAnnotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}},
        decode={"podAnnotations": {"sidecar.istio.io/inject": "false"}, "priorityClassName": "gpu-serving"},
        gateway={"podLabels": {"team": "platform"}})
    found = templates(spec)
    prefill, decode, gateway = (found[f"demo-{role}"] for role in ROLES)
    assert prefill["metadata"]["labels"]["team"] == "ml" and prefill["metadata"]["labels"]["cost-center"] == "llm-7"
    assert prefill["metadata"]["labels"]["laps.io/role"] == "prefill"   # the operator's stay
    assert prefill["metadata"]["annotations"] == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    assert decode["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert "team" not in decode["metadata"]["labels"]
    assert gateway["metadata"]["labels"]["team"] == "platform" and "annotations" not in gateway["metadata"]
    assert [t["spec"].get("priorityClassName") for t in (prefill, decode, gateway)] == ["gpu-serving"] * 2 + [None]
    for child in build_children(CLUSTER, spec):
        if child["kind"] in ("StatefulSet", "Deployment"):
            # The workloads' selectors hold the operator's labels only: they are immutable.
            assert "team" not in child["spec"]["selector"]["matchLabels"]
            kubernetes_validate.validate(child, "1.37", strict=True)


def test_a_topology_spread_without_a_selector_spreads_the_roles_own_pods():
    mine = {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"team": "ml"}}, "matchLabelKeys": ["pod-template-hash"]}
    spec = parsed(decode={"topologySpreadConstraints": [ZONES, mine]}, gateway={"topologySpreadConstraints": [ZONES]})
    found = pods(build_children(CLUSTER, spec))
    # Kubernetes counts no pod for a constraint without one, which would spread nothing.
    own = {"matchLabels": {"laps.io/cluster": "demo", "laps.io/role": "decode"}}
    assert found["demo-decode"]["topologySpreadConstraints"] == [ZONES | {"labelSelector": own}, mine]
    assert found["demo-gateway"]["topologySpreadConstraints"][0]["labelSelector"] == {
        "matchLabels": {"laps.io/cluster": "demo", "laps.io/role": "gateway"}}
    assert "topologySpreadConstraints" not in found["demo-prefill"]
    for child in build_children(CLUSTER, spec):
        if child["kind"] in ("StatefulSet", "Deployment"):
            kubernetes_validate.validate(child, "1.37", strict=True)


OWNED = [
    ({"prefill": {"podLabels": {"app.kubernetes.io/component": "engine"}}},
     "spec.prefill.podLabels: app.kubernetes.io/component is one of the labels the operator sets on these pods"),
    ({"gateway": {"podLabels": {"app.kubernetes.io/instance": "mine"}}},
     "spec.gateway.podLabels: app.kubernetes.io/instance is one of the labels the operator sets"),
    ({"prefill": {"podLabels": {"laps.io/prefill-group": "short"}}},
     "spec.prefill.podLabels: laps.io/prefill-group: keys under laps.io/ are the operator's"),
    ({"decode": {"podAnnotations": {"laps.io/last-applied": "{}"}}},
     "spec.decode.podAnnotations: laps.io/last-applied: keys under laps.io/ are the operator's"),
    ({"gateway": {"serviceAnnotations": {"laps.io/owner": "me"}}},
     "spec.gateway.serviceAnnotations: laps.io/owner: keys under laps.io/ are the operator's"),
    # The API server takes annotation keys in any case: LAPS.IO/ is laps.io/.
    ({"prefill": {"podAnnotations": {"LAPS.IO/last-applied": "{}"}}},
     "spec.prefill.podAnnotations: LAPS.IO/last-applied: keys under laps.io/ are the operator's"),
]


@pytest.mark.parametrize(("spec", "says"), OWNED, ids=[s.split(":")[0] + " " + s.split()[1] for _, s in OWNED])
def test_a_label_or_annotation_the_operator_sets_is_an_invalid_spec_naming_it(spec, says):
    # Field by field fine, so the CRD passes it; the operator's value would silently win.
    with pytest.raises(InvalidSpecError, match=re.escape(says)):
        parsed(**spec)


def test_an_operator_label_name_is_a_fine_annotation_and_a_kubernetes_io_label_a_fine_label():
    spec = parsed(prefill={"podAnnotations": {"app.kubernetes.io/name": "x"},
                           "podLabels": {"app.kubernetes.io/part-of": "search"}})
    assert templates(spec)["demo-prefill"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "search"


def test_an_annotation_key_with_capitals_in_its_prefix_reaches_the_pods_and_the_service():
    # The API server lower-cases annotation keys before checking them (label keys it does not).
    spec = parsed(decode={"podAnnotations": {"Example.com/Owner": "ml"}},
                  gateway={"serviceAnnotations": {"Cloud.Example.com/Internal": "true"}})
    assert templates(spec)["demo-decode"]["metadata"]["annotations"] == {"Example.com/Owner": "ml"}
    assert gateway_service(spec)["metadata"]["annotations"] == {"Cloud.Example.com/Internal": "true"}


MALFORMED = [
    ({"podLabels": {"team name": "ml"}}, "spec.prefill.podLabels: 'team name' is not a label or annotation key"),
    ({"podLabels": {"Example.com/x": "1"}}, "spec.prefill.podLabels: 'Example.com/x' is not a label"),
    ({"podAnnotations": {"team name": "ml"}}, "spec.prefill.podAnnotations: 'team name' is not a label or annotation"),
    ({"podAnnotations": {"big": "x" * ANNOTATIONS_MAX_BYTES}},
     f"spec.prefill.podAnnotations: {ANNOTATIONS_MAX_BYTES + 3} bytes of keys and values: Kubernetes takes at most"),
    ({"podLabels": {"team": "machine learning"}},
     "spec.prefill.podLabels: team: 'machine learning' is not a label value"),
    ({"priorityClassName": "GPU_High"}, "spec.prefill.priorityClassName: String should match pattern"),
    ({"topologySpreadConstraints": [ZONES | {"whenUnsatisfiable": "ScheduleAnyway"}]},
     "spec.prefill.topologySpreadConstraints.0: minDomains needs whenUnsatisfiable DoNotSchedule"),
    ({"topologySpreadConstraints": [ZONES, ZONES | {"maxSkew": 2}]},
     "spec.prefill.topologySpreadConstraints: must not repeat a topologyKey with the same whenUnsatisfiable"),
    ({"topologySpreadConstraints": [ZONES | {"topologyKey": "zone name"}]},
     "spec.prefill.topologySpreadConstraints.0: 'zone name' is not a label or annotation key"),
    ({"topologySpreadConstraints": [ZONES | {"labelSelector": {"matchLabel": {"a": "b"}}}]},
     "spec.prefill.topologySpreadConstraints.0.labelSelector.matchLabel: Extra inputs are not permitted"),
    # A key in both matchLabelKeys and the selector: the workload or each of its pods is refused,
    # and left out, the selector is the operator's.
    ({"topologySpreadConstraints": [ZONES | {"matchLabelKeys": ["laps.io/role"]}]},
     "spec.prefill.topologySpreadConstraints.0: matchLabelKeys: laps.io/role is also a key of labelSelector "
     "(left out: the role's own pods, laps.io/cluster, laps.io/role)"),
    ({"topologySpreadConstraints": [ZONES | {"labelSelector": {"matchLabels": {"team": "ml"}},
                                             "matchLabelKeys": ["pod-template-hash", "team"]}]},
     "spec.prefill.topologySpreadConstraints.0: matchLabelKeys: team is also a key of labelSelector, which"),
    ({"topologySpreadConstraints": [ZONES | {"matchLabelKeys": ["tier"], "labelSelector": {
        "matchExpressions": [{"key": "tier", "operator": "Exists"}]}}]},
     "spec.prefill.topologySpreadConstraints.0: matchLabelKeys: tier is also a key of labelSelector"),
]


@pytest.mark.parametrize(("pool", "says"), MALFORMED, ids=[s.split(": ")[0] for _, s in MALFORMED])
def test_what_the_api_server_would_refuse_in_every_write_is_an_invalid_spec_naming_the_field(pool, says):
    with pytest.raises(InvalidSpecError, match=re.escape(says)):
        spec_of(prefill=pool)


# Python's `$` matches before a final newline as well; the API server's (Go's) does not, and
# refuses such a key or value in every write of the workload.
TRAILING_NEWLINE = [
    ({"prefill": {"podLabels": {"team\n": "ml"}}}, "spec.prefill.podLabels: 'team\\n' is not a label"),
    ({"prefill": {"podLabels": {"team": "ml\n"}}}, "spec.prefill.podLabels: team: 'ml\\n' is not a label value"),
    ({"decode": {"podAnnotations": {"team\n": "ml"}}}, "spec.decode.podAnnotations: 'team\\n' is not a label"),
    ({"gateway": {"topologySpreadConstraints": [ZONES | {"topologyKey": "zone\n"}]}},
     "spec.gateway.topologySpreadConstraints.0: 'zone\\n' is not a label or annotation key"),
    ({"gateway": {"topologySpreadConstraints": [ZONES | {"matchLabelKeys": ["pod-template-hash\n"]}]}},
     "spec.gateway.topologySpreadConstraints.0: 'pod-template-hash\\n' is not a label or annotation key"),
    ({"decode": {"resources": {"limits": {"memory": "16Gi\n"}}}},
     "spec.decode.resources.limits: memory: '16Gi\\n' is not a quantity"),
    ({"monitoring": {"prometheusURL": "http://prometheus:9090\n"}},
     "spec.monitoring.prometheusURL: 'http://prometheus:9090\\n': must be empty or an http:// or https:// base URL"),
]


@pytest.mark.parametrize(("spec", "says"), TRAILING_NEWLINE, ids=[s.split(":")[0] for _, s in TRAILING_NEWLINE])
def test_a_key_or_value_ending_in_a_newline_is_an_invalid_spec_naming_it(spec, says):
    with pytest.raises(InvalidSpecError, match=re.escape(says)):
        spec_of(**spec)


@pytest.mark.parametrize(("field", "value", "where"), [
    ("podLabels", {"team": "x" * 64}, "spec.gateway.podLabels.team"),
    ("podLabels", {"team": 7}, "spec.gateway.podLabels.team"),
    ("podAnnotations", {"a": ["list"]}, "spec.gateway.podAnnotations.a"),
    ("serviceAnnotations", {"a": 1}, "spec.gateway.serviceAnnotations.a"),
    ("priorityClassName", "High", "spec.gateway.priorityClassName"),
    ("topologySpreadConstraints", [{"maxSkew": 1, "topologyKey": "zone"}], "spec.gateway.topologySpreadConstraints.0"),
    ("topologySpreadConstraints", [ZONES | {"maxSkew": 0}], "spec.gateway.topologySpreadConstraints.0.maxSkew"),
    ("topologySpreadConstraints", [ZONES | {"whenUnsatisfiable": "Never"}],
     "spec.gateway.topologySpreadConstraints.0.whenUnsatisfiable"),
    ("topologySpreadConstraints", [ZONES | {"maxSkwe": 1}], "spec.gateway.topologySpreadConstraints.0"),
])
def test_the_crd_refuses_a_malformed_value_at_the_door(field, value, where):
    found = errors(with_spec(**{f"gateway.{field}": value}))
    assert any(e.startswith(where + ":") for e in found), found


def test_the_crd_checks_label_values_and_priority_class_names_with_the_operators_patterns():
    props = SCHEMA["properties"]["spec"]["properties"]
    for role in ROLES:
        values = props[role]["properties"]["podLabels"]["additionalProperties"]
        assert (values["pattern"], values["maxLength"]) == (LABEL_VALUE_PATTERN, LABEL_VALUE_MAX_LENGTH)
        assert props[role]["properties"]["priorityClassName"]["pattern"] == DNS_SUBDOMAIN_PATTERN
    assert "serviceAnnotations" in props["gateway"]["properties"]
    assert "serviceAnnotations" not in {*props["prefill"]["properties"], *props["decode"]["properties"]}
