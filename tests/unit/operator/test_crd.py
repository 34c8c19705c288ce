"""The LAPSCluster CRD: structure, examples, invalid CRs, defaults agreeing with the operator."""
from __future__ import annotations

import copy
import re

import kubernetes_validate
import pytest
import yaml

from laps_operator.naming import CLUSTER_NAME_PATTERN, MAX_CLUSTER_NAME, ClusterRef, cluster_name_problem
from laps_operator.render.builders import build_children
from laps_operator.spec.cluster import InvalidSpecError, parse_spec
from laps_operator.spec.formats import PROMETHEUS_URL_PATTERN, QUANTITY_PATTERN
from tests.unit.operator.crd_jsonschema import (
    EXAMPLES,
    apply_defaults,
    errors,
    load_crd,
    openapi_schema,
)

CRD = load_crd()
SCHEMA = openapi_schema(CRD)
MINIMAL = {
    "apiVersion": "laps.io/v1alpha1",
    "kind": "LAPSCluster",
    "metadata": {"name": "c"},
    "spec": {"model": {"name": "m", "path": "/models/m.gguf"}},
}


def with_spec(**changes: object) -> dict:
    """MINIMAL with dotted-path changes, e.g. with_spec(**{"prefill.replicas": 0})."""
    doc = copy.deepcopy(MINIMAL)
    for dotted, value in changes.items():
        node = doc["spec"]
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return doc


def test_crd_names_scope_and_status_subresource():
    spec = CRD["spec"]
    assert (spec["group"], spec["scope"]) == ("laps.io", "Namespaced")
    assert spec["names"]["kind"] == "LAPSCluster"
    assert spec["names"]["plural"] == "lapsclusters"
    assert spec["names"]["shortNames"] == ["laps"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Short"] == ".status.groupSizes.short"
    assert columns["Long"] == ".status.groupSizes.long"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_crd_is_a_valid_apiextensions_object():
    kubernetes_validate.validate(CRD, "1.37", strict=True)


def test_schema_is_structural_every_node_has_a_type():
    # A structural schema gives every node a type, except int-or-string and preserve-unknown nodes.
    def walk(node: dict, path: str) -> list[str]:
        missing = []
        if "type" not in node and not node.get("x-kubernetes-int-or-string") \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            missing.append(path)
        for name, sub in (node.get("properties") or {}).items():
            missing += walk(sub, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                missing += walk(node[key], f"{path}[{key}]")
        return missing

    assert walk(SCHEMA, "") == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates_and_parses(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs, f"{path} holds no document"
    for doc in docs:
        assert errors(doc) == []
        parse_spec(apply_defaults(doc, SCHEMA)["spec"])


def test_examples_cover_minimal_full_and_gpu():
    names = {p.name for p in EXAMPLES}
    assert {"lapscluster.yaml", "lapscluster-minimal.yaml", "lapscluster-gpu.yaml"} <= names
    gpu = yaml.safe_load((EXAMPLES[0].parent / "lapscluster-gpu.yaml").read_text())
    assert gpu["spec"]["engine"]["backend"] == "sglang"
    assert gpu["spec"]["prefill"]["resources"]["limits"]["nvidia.com/gpu"] == 2


INVALID = [
    (with_spec(**{"engine.backend": "vllm"}), "spec.engine.backend", "vllm"),
    (with_spec(**{"prefill.replicas": 0}), "spec.prefill.replicas", "minimum"),
    (with_spec(**{"decode.replicas": "two"}), "spec.decode.replicas", "not of type 'integer'"),
    (with_spec(**{"laps.lengthThreshold": 0}), "spec.laps.lengthThreshold", "minimum"),
    (with_spec(**{"laps.scheduler.waitWindowMs": -1}), "spec.laps.scheduler.waitWindowMs", "minimum"),
    (with_spec(**{"laps.batchPrefillGraphs.batchSizes": [1, 2, 2]}), "spec.laps.batchPrefillGraphs.batchSizes",
     "non-unique"),
    (with_spec(**{"laps.batchPrefillGraphs.batchSizes": [1, 8192]}), "spec.laps.batchPrefillGraphs.batchSizes.1",
     "maximum"),
    (with_spec(**{"laps.batchPrefillGraphs.seqLengths": []}), "spec.laps.batchPrefillGraphs.seqLengths", "non-empty"),
    (with_spec(**{"gateway.serviceType": "Ingress"}), "spec.gateway.serviceType", "Ingress"),
    (with_spec(**{"gateway.port": 70000}), "spec.gateway.port", "maximum"),
    (with_spec(**{"prefill.resources.limits": {"nvidia.com/gpu": 1.5}}), "spec.prefill.resources.limits.nvidia.com/gpu",
     "is not valid"),
    (with_spec(**{"laps.lenghtThreshold": 512}), "spec.laps", "lenghtThreshold"),
    (with_spec(**{"drain.gracePeriodSeconds": 2}), "spec.drain.gracePeriodSeconds", "minimum"),
    (with_spec(**{"drain.preStopSeconds": -1}), "spec.drain.preStopSeconds", "minimum"),
    (with_spec(**{"drain.gracePeriodSeconds": 30.5}), "spec.drain.gracePeriodSeconds", "not of type 'integer'"),
    (with_spec(**{"gateway.requestDeadlineSeconds": -1}), "spec.gateway.requestDeadlineSeconds", "minimum"),
    (with_spec(**{"model": {"name": "m"}}), "spec.model", "'path' is a required property"),
    (with_spec(**{"laps.prefixCache": "no"}), "spec.laps.prefixCache", "not of type 'boolean'"),
    (with_spec(**{"laps.prefixAffinity": 0}), "spec.laps.prefixAffinity", "not of type 'boolean'"),
    (with_spec(**{"laps.prefixWarm": "yes"}), "spec.laps.prefixWarm", "not of type 'boolean'"),
    ({**MINIMAL, "spec": {}}, "spec", "'model' is a required property"),
    # Values the API server would refuse in the children, or the allocation loop could not use.
    (with_spec(**{"prefill.resources.limits": {"cpu": "two"}}), "spec.prefill.resources.limits.cpu", "does not match"),
    (with_spec(**{"decode.resources.requests": {"memory": "2 GB"}}), "spec.decode.resources.requests.memory",
     "does not match"),
    (with_spec(**{"gateway.resources.requests": {"cpu": "-1"}}), "spec.gateway.resources.requests.cpu", "does not match"),
    (with_spec(**{"monitoring.prometheusURL": "prometheus:9090"}), "spec.monitoring.prometheusURL", "does not match"),
    (with_spec(**{"monitoring.prometheusURL": "http://p:9090/?x"}), "spec.monitoring.prometheusURL", "does not match"),
    # Pod fields the API server would refuse in every write of the workloads.
    (with_spec(**{"prefill.tolerations": [{"kee": "gpu"}]}), "spec.prefill.tolerations.0", "'kee' was unexpected"),
    (with_spec(**{"gateway.affinity": {"nodeAfinity": {}}}), "spec.gateway.affinity", "'nodeAfinity' was unexpected"),
    (with_spec(imagePullSecrets=[{"secret": "r"}]), "spec.imagePullSecrets.0", "'name' is a required property"),
    # Admission control: a share is of the decode slots, a bound is a count.
    (with_spec(**{"gateway.maxDecodeShare": 1.5}), "spec.gateway.maxDecodeShare", "is greater than the maximum of 1"),
    (with_spec(**{"gateway.maxPendingTokensPerPod": -1}), "spec.gateway.maxPendingTokensPerPod",
     "is less than the minimum of 0"),
    # "" is not the default query (unset is).
    (with_spec(**{"monitoring.prometheusURL": "http://p:9090", "monitoring.pressureQuery": ""}),
     "spec.monitoring.pressureQuery", "should be non-empty"),
]


@pytest.mark.parametrize(("doc", "where", "says"), INVALID, ids=[w + ":" + s for _, w, s in INVALID])
def test_invalid_crs_are_rejected_with_the_field_and_reason(doc, where, says):
    found = errors(doc)
    assert any(e.startswith(where + ":") and says in e for e in found), found
    # The operator's own check agrees (it is what guards servers without schema validation).
    with pytest.raises(InvalidSpecError):
        parse_spec(apply_defaults(doc, SCHEMA)["spec"])


CROSS_FIELD = [
    ({"laps": {"allocation": {"enabled": True}}, "prefill": {"replicas": 1}}, "needs prefill.replicas >= 2"),
    ({"laps": {"allocation": {"enabled": True, "minPerGroup": 2}}, "prefill": {"replicas": 3}},
     "at least 2 * laps.allocation.minPerGroup"),
    ({"prefill": {"tensorParallelSize": 2}}, "needs engine.backend sglang"),
    ({"drain": {"gracePeriodSeconds": 8, "preStopSeconds": 5}},
     "drain.gracePeriodSeconds must be at least drain.preStopSeconds + 4"),
    ({"laps": {"prefixCache": False, "prefixAffinity": True}},
     "laps.prefixAffinity routes a prompt to the prefill pod expected to hold its prefix: it needs laps.prefixCache"),
    ({"engine": {"backend": "sglang"}, "laps": {"prefixWarm": True}},
     "laps.prefixWarm (prefix warming) needs engine.backend builtin: SGLang has no warm endpoint"),
    ({"laps": {"prefixAffinity": False, "prefixWarm": True}},
     "laps.prefixWarm caches a turn's answer on the prefill pod that served it, for the chat's next turn, "
     "which only cache affinity sends back there: it needs laps.prefixAffinity"),
    # Fields that would otherwise be accepted and ignored.
    ({"gateway": {"rateLimitPerKey": 5}}, "gateway.rateLimitPerKey counts requests per API key: it needs "
     "gateway.apiKeysSecret"),
    ({"engine": {"backend": "sglang", "maxQueuedRequests": 64}},
     "engine.maxQueuedRequests bounds the builtin engine's queue: it needs engine.backend builtin"),
    ({"monitoring": {"pressureQuery": "sum by (group) (laps_pending)"}},
     "monitoring.pressureQuery is a Prometheus query: it needs monitoring.prometheusURL"),
    ({"autoscaling": {"enabled": True}}, "autoscaling.enabled needs monitoring.prometheusURL"),
    ({"autoscaling": {"prefill": {"min": 5, "max": 4}}}, "autoscaling.prefill.min must be <= autoscaling.prefill.max"),
    ({"autoscaling": {"decode": {"min": 3, "max": 2}}}, "autoscaling.decode.min must be <= autoscaling.decode.max"),
    ({"autoscaling": {"enabled": True, "prefill": {"min": 1}}, "monitoring": {"prometheusURL": "http://p:9090"},
      "laps": {"allocation": {"enabled": True}}},
     "with laps.allocation.enabled, autoscaling.prefill.min must be at least 2 * laps.allocation.minPerGroup"),
]


@pytest.mark.parametrize(("changes", "message"), CROSS_FIELD, ids=[m for _, m in CROSS_FIELD])
def test_cross_field_rules_exist_in_the_crd_and_the_operator(changes, message):
    rules = {r["message"] for r in SCHEMA["properties"]["spec"]["x-kubernetes-validations"]}
    assert any(message in r for r in rules), rules
    spec = {**MINIMAL["spec"], **changes}
    assert errors({**MINIMAL, "spec": spec}) == []  # per-field fine: only the rule spans fields
    with pytest.raises(InvalidSpecError, match=re.escape(message)):
        parse_spec(apply_defaults({**MINIMAL, "spec": spec}, SCHEMA)["spec"])


def test_crd_defaults_equal_the_operators_defaults():
    from_server = parse_spec(apply_defaults(MINIMAL, SCHEMA)["spec"])
    from_operator = parse_spec(MINIMAL["spec"])
    assert from_server == from_operator
    assert from_operator.prefill.replicas == 2 and from_operator.decode.replicas == 1
    assert from_operator.laps.length_threshold == 256


def test_status_with_groups_and_pressure_validates():
    doc = {**MINIMAL, "status": {
        "phase": "Ready", "observedGeneration": 3,
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "ok",
                        "lastTransitionTime": "2026-11-21T22:00:00Z"}],
        "groups": {"short": ["c-prefill-0"], "long": ["c-prefill-1"]},
        "groupSizes": {"short": 1, "long": 1},
        "pressure": {"short": 1.5, "long": None},
        "lastRebalanceTime": None,
    }}
    assert errors(doc) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_rendered_manifests_of_every_example_validate_against_kubernetes_1_37(path):
    doc = apply_defaults(yaml.safe_load(path.read_text()), SCHEMA)
    children = build_children(ClusterRef(doc["metadata"]["name"], "serving", "uid-1"), parse_spec(doc["spec"]))
    for child in children:
        if child["kind"] == "PodMonitor":  # Prometheus Operator's CRD, not a built-in kind
            assert child["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(child, "1.37", strict=True)


def test_status_of_the_allocation_loop_validates():
    doc = {**MINIMAL, "status": {
        "pressure": {"short": 3.0, "long": 4000.0, "perPod": {"short": 1.5, "long": 2000.0}, "source": "prometheus"},
        "lastRebalanceTime": "2026-11-21T22:00:00Z",
        "conditions": [{"type": "PressureUnavailable", "status": "False", "reason": "Recovered", "message": "ok",
                        "lastTransitionTime": "2026-11-21T22:00:00Z"}],
        "allocation": {
            "lastDecision": "balanced within ratio 2",
            "policy": {"wanted": None, "streak": 0, "lastDirection": "short_to_long",
                       "movedAt": {"c-prefill-1": 1795365000.5}},
            "history": [{"time": "2026-11-21T22:00:00Z", "pod": "c-prefill-1", "from": "short", "to": "long",
                         "reason": "short per pod 0, long per pod 2e+03"}],
        },
    }}
    assert errors(doc) == []
    too_long = {**doc, "status": {"allocation": {"history": [{"pod": "p"}] * 11}}}
    assert any("history" in e for e in errors(too_long))


def test_drain_and_request_deadline_fields_are_described_and_defaulted():
    props = SCHEMA["properties"]["spec"]["properties"]
    drain, deadline = props["drain"], props["gateway"]["properties"]["requestDeadlineSeconds"]
    assert drain["default"] == {} and drain["description"]
    assert {k: v["default"] for k, v in drain["properties"].items()} == {
        "gracePeriodSeconds": 60, "preStopSeconds": 5}
    assert all(v["description"] for v in drain["properties"].values())
    assert (deadline["default"], deadline["minimum"]) == (600.0, 0) and deadline["description"]
    spec = parse_spec(apply_defaults(MINIMAL, SCHEMA)["spec"])
    assert (spec.drain.grace_period_seconds, spec.drain.pre_stop_seconds) == (60, 5)
    assert spec.gateway.request_deadline_seconds == 600.0


def test_prefix_cache_and_affinity_are_described_booleans_on_by_default():
    laps = SCHEMA["properties"]["spec"]["properties"]["laps"]["properties"]
    assert (laps["prefixCache"]["type"], laps["prefixCache"]["default"]) == ("boolean", True)
    # prefixAffinity has no default: unset, it follows prefixCache.
    assert laps["prefixAffinity"]["type"] == "boolean" and "default" not in laps["prefixAffinity"]
    assert laps["prefixCache"]["description"] and laps["prefixAffinity"]["description"]
    spec = parse_spec(apply_defaults(MINIMAL, SCHEMA)["spec"])
    assert (spec.laps.prefix_cache, spec.laps.affinity) == (True, True)
    cache_off = parse_spec(apply_defaults(with_spec(**{"laps.prefixCache": False}), SCHEMA)["spec"])
    assert (cache_off.laps.prefix_cache, cache_off.laps.affinity) == (False, False)
    both_off = with_spec(**{"laps.prefixCache": False, "laps.prefixAffinity": False})
    assert errors(both_off) == []
    assert parse_spec(apply_defaults(both_off, SCHEMA)["spec"]).laps.prefix_cache is False


def test_prefix_warm_is_a_described_boolean_that_follows_affinity_on_the_builtin_backend():
    laps = SCHEMA["properties"]["spec"]["properties"]["laps"]["properties"]
    # No default: unset, it follows the affinity (builtin) or is off (sglang).
    assert laps["prefixWarm"]["type"] == "boolean" and "default" not in laps["prefixWarm"]
    assert laps["prefixWarm"]["description"]
    assert parse_spec(apply_defaults(MINIMAL, SCHEMA)["spec"]).warm is True
    sglang = with_spec(**{"engine.backend": "sglang"})
    assert parse_spec(apply_defaults(sglang, SCHEMA)["spec"]).warm is False
    no_affinity = with_spec(**{"laps.prefixAffinity": False})
    assert parse_spec(apply_defaults(no_affinity, SCHEMA)["spec"]).warm is False
    for value in (True, False):
        doc = with_spec(**{"laps.prefixWarm": value})
        assert errors(doc) == []
        assert parse_spec(apply_defaults(doc, SCHEMA)["spec"]).warm is value


def test_the_crd_restricts_only_what_a_crd_may_in_metadata():
    # apiextensions refuses a schema that says anything about metadata but name and generateName.
    metadata = SCHEMA["properties"]["metadata"]
    assert set(metadata) <= {"type", "properties"} and set(metadata["properties"]) <= {"name", "generateName"}


NAMES = [
    ("a" * MAX_CLUSTER_NAME, True),
    ("smollm2-" + "x" * (MAX_CLUSTER_NAME - 8), True),
    ("a" * (MAX_CLUSTER_NAME + 1), False),
    ("a" * 63, False),
    ("a" * 253, False),
    ("my.cluster", False),   # a valid name for a custom resource, not for `<name>-gateway`
    ("1cluster", False),     # a Service name starts with a letter
    ("Cluster", False),
]


@pytest.mark.parametrize(("name", "fits"), NAMES, ids=[f"{n[:12]}..{len(n)}" for n, _ in NAMES])
def test_a_cluster_name_must_fit_its_childrens_names_in_the_crd_and_the_operator(name, fits):
    doc = {**MINIMAL, "metadata": {"name": name}}
    assert (errors(doc) == []) is fits, errors(doc)
    assert (cluster_name_problem(name) is None) is fits
    if not fits:
        return
    # What a real API server checks on the children (the emulator and kubernetes-validate do not).
    dns_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    for child in build_children(ClusterRef(name, "serving", "uid-1"), parse_spec(MINIMAL["spec"])):
        meta = child["metadata"]
        if child["kind"] == "Service":
            assert dns_1035.match(meta["name"]) and len(meta["name"]) <= 63, meta["name"]
        if child["kind"] == "StatefulSet":
            # Its pods' controller-revision-hash label: `<statefulset>-<hash of up to 10 characters>`.
            assert len(meta["name"] + "-0123456789") <= 63
            assert len(f"{meta['name']}-{child['spec']['replicas'] - 1}") <= 63   # the pods' names
        assert all(len(v) <= 63 for v in meta["labels"].values()), meta["labels"]


def test_quantity_and_url_patterns_are_the_operators():
    spec = SCHEMA["properties"]["spec"]["properties"]
    maps = [spec[pool]["properties"]["resources"]["properties"][kind]["additionalProperties"]
            for pool in ("prefill", "decode", "gateway") for kind in ("limits", "requests")]
    assert {m["pattern"] for m in maps} == {QUANTITY_PATTERN}
    assert spec["monitoring"]["properties"]["prometheusURL"]["pattern"] == PROMETHEUS_URL_PATTERN
    name = SCHEMA["properties"]["metadata"]["properties"]["name"]
    assert (name["pattern"], name["maxLength"]) == (CLUSTER_NAME_PATTERN, MAX_CLUSTER_NAME)


@pytest.mark.parametrize("resources", [
    {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": 1, "memory": "1024Mi", "nvidia.com/gpu": 1}},
    {"requests": {"cpu": "+1.5", "memory": "1e9"}},
])
def test_valid_quantities_pass_both_checks(resources):
    doc = with_spec(**{"prefill.resources": resources})
    assert errors(doc) == []
    parse_spec(apply_defaults(doc, SCHEMA)["spec"])


def test_a_request_over_its_limit_is_an_invalid_spec_naming_both():
    # No CRD rule (CEL's quantity library is too new to rely on): the operator says it.
    doc = with_spec(**{"decode.resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}})
    with pytest.raises(InvalidSpecError, match=re.escape("spec.decode.resources: requests.memory (2Gi) exceeds "
                                                         "limits.memory (1Gi)")):
        parse_spec(apply_defaults(doc, SCHEMA)["spec"])
