"""What the pods are given to run where: pull secrets on every pod, the gateway's placement, GPU
counts the API server accepts and the engine uses, and tolerations/affinity checked before the
API server would refuse the workloads for them."""
from __future__ import annotations

import re

import kubernetes_validate
import pytest

from laps_operator.render.builders import (
    build_children,
    build_decode_deployment,
    build_gateway_deployment,
    build_prefill_statefulset,
)
from laps_operator.spec.cluster import InvalidSpecError
from laps_operator.spec.formats import (
    LABEL_VALUE_MAX_LENGTH,
    LABEL_VALUE_PATTERN,
    TOLERATION_KEY_MAX_LENGTH,
    TOLERATION_KEY_PATTERN,
    overcommittable,
    quantity,
)
from tests.unit.operator.crd_jsonschema import apply_defaults, errors
from tests.unit.operator.test_builders import CLUSTER, container, spec_of
from tests.unit.operator.test_crd import SCHEMA, with_spec

SGLANG = {"backend": "sglang", "image": "sglang:laps", "device": "cuda"}


def pods(children: list[dict]) -> dict[str, dict]:
    """Each workload's pod spec by workload name."""
    return {c["metadata"]["name"]: c["spec"]["template"]["spec"]
            for c in children if c["kind"] in ("StatefulSet", "Deployment")}


def api_server_resource_errors(resources: dict) -> list[str]:
    """What the API server checks of a container's resources beyond their schema
    (ValidateResourceRequirements): a request within its limit, and equal to it, and present,
    for what it does not overcommit."""
    found = []
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    for name, value in requests.items():
        if name not in limits:
            if not overcommittable(name):
                found.append(f"{name}: Limit must be set for non overcommitable resources")
        elif quantity(value) > quantity(limits[name]) or (
                not overcommittable(name) and quantity(value) != quantity(limits[name])):
            found.append(f"{name}: request {value}, limit {limits[name]}")
    return found


def test_image_pull_secrets_are_on_every_pod_the_operator_creates():
    secrets = [{"name": "registry-a"}, {"name": "registry-b"}]
    children = build_children(CLUSTER, spec_of(imagePullSecrets=secrets))
    found = pods(children)
    assert set(found) == {"demo-prefill", "demo-decode", "demo-gateway"}
    assert all(pod["imagePullSecrets"] == secrets for pod in found.values())
    assert all("imagePullSecrets" not in pod for pod in pods(build_children(CLUSTER, spec_of())).values())


def test_image_pull_secrets_are_names_given_once():
    assert errors(with_spec(imagePullSecrets=[{"name": "r", "namespace": "x"}])) != []
    with pytest.raises(InvalidSpecError, match=re.escape("spec.imagePullSecrets.0.namespace: Extra inputs")):
        spec_of(imagePullSecrets=[{"name": "r", "namespace": "x"}])
    with pytest.raises(InvalidSpecError, match="spec.imagePullSecrets: must not name a Secret twice"):
        spec_of(imagePullSecrets=[{"name": "r"}, {"name": "r"}])
    with pytest.raises(InvalidSpecError, match=re.escape("spec.imagePullSecrets.0.name")):
        spec_of(imagePullSecrets=[{"name": ""}])


GATEWAY_PLACEMENT = {
    "nodeSelector": {"node-role": "frontend"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gateway", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                     "tolerationSeconds": 30}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                            "labelSelector": {"matchLabels": {"laps.io/role": "gateway"}}}}]}},
}


def test_the_gateway_is_placed_as_written_and_apart_from_the_pools():
    doc = with_spec(gateway=GATEWAY_PLACEMENT, prefill={"nodeSelector": {"gpu": "h100"}})
    assert errors(doc) == []
    spec = spec_of(**apply_defaults(doc, SCHEMA)["spec"])
    gateway = build_gateway_deployment(CLUSTER, spec)["spec"]["template"]["spec"]
    assert {k: gateway[k] for k in GATEWAY_PLACEMENT} == GATEWAY_PLACEMENT
    prefill = build_prefill_statefulset(CLUSTER, spec)["spec"]["template"]["spec"]
    decode = build_decode_deployment(CLUSTER, spec)["spec"]["template"]["spec"]
    assert prefill["nodeSelector"] == {"gpu": "h100"} and "tolerations" not in prefill
    assert not {"nodeSelector", "tolerations", "affinity"} & set(decode)
    kubernetes_validate.validate(build_gateway_deployment(CLUSTER, spec), "1.37", strict=True)


def test_the_gateway_takes_the_same_placement_fields_as_the_pools():
    props = SCHEMA["properties"]["spec"]["properties"]
    fields = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "topologySpreadConstraints",
              "podLabels", "podAnnotations")
    placement = [{f: props[role]["properties"][f] for f in fields} for role in ("prefill", "decode", "gateway")]
    assert placement[0] == placement[1] == placement[2]


@pytest.mark.parametrize(("extra_args", "gpus"), [([], 2), (["--pp-size", "2"], 4)])
def test_a_gpu_request_without_a_limit_gets_the_request_as_its_limit(extra_args, gpus):
    # The report: a GPU request and no limit got tensorParallelSize as the limit, below the
    # request, and the API server refused the StatefulSet on every write.
    spec = spec_of(engine=SGLANG | {"extraArgs": extra_args},
                   prefill={"tensorParallelSize": 2, "resources": {"requests": {"nvidia.com/gpu": gpus}}})
    resources = container(build_prefill_statefulset(CLUSTER, spec))["resources"]
    assert resources == {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}
    for child in build_children(CLUSTER, spec):
        for pod in ([child["spec"]["template"]["spec"]] if child["kind"] in ("StatefulSet", "Deployment") else []):
            assert api_server_resource_errors(pod["containers"][0]["resources"]) == []


def test_any_resource_kubernetes_does_not_overcommit_gets_its_request_as_limit():
    spec = spec_of(gateway={"resources": {"requests": {"cpu": "1", "example.com/fpga": 1, "hugepages-2Mi": "64Mi"}}})
    resources = container(build_gateway_deployment(CLUSTER, spec))["resources"]
    assert resources["limits"] == {"example.com/fpga": "1", "hugepages-2Mi": "64Mi"}  # cpu may stay unlimited
    assert api_server_resource_errors(resources) == []


@pytest.mark.parametrize(("engine", "pool", "says"), [
    # The report's spec: two GPUs for one tensor-parallel rank.
    (SGLANG, {"resources": {"requests": {"nvidia.com/gpu": 2}}},
     "prefill.resources nvidia.com/gpu (2) must equal prefill.tensorParallelSize (1), the GPUs one engine uses"),
    (SGLANG, {"tensorParallelSize": 4, "resources": {"limits": {"nvidia.com/gpu": "2"}}},
     "prefill.resources nvidia.com/gpu (2) must equal prefill.tensorParallelSize (4)"),
    (SGLANG | {"extraArgs": ["--pp-size", "2"]},
     {"tensorParallelSize": 2, "resources": {"limits": {"nvidia.com/gpu": 2}}},
     "nvidia.com/gpu (2) must equal prefill.tensorParallelSize (2) x --pp-size 2 in engine.extraArgs = 4"),
    ({"device": "cuda"}, {"resources": {"limits": {"nvidia.com/gpu": 2}}},
     "prefill.resources nvidia.com/gpu (2) must equal prefill.tensorParallelSize (1)"),
], ids=["request-2-tp-1", "limit-2-tp-4", "pipeline-stages", "builtin-cuda"])
def test_a_gpu_count_other_than_what_the_engine_uses_is_an_invalid_spec_naming_both(engine, pool, says):
    doc = with_spec(engine=engine, prefill=pool)
    assert errors(doc) == []  # field by field fine: the rule spans fields (no CEL: quantities)
    with pytest.raises(InvalidSpecError, match=re.escape(says)):
        spec_of(**apply_defaults(doc, SCHEMA)["spec"])


@pytest.mark.parametrize(("extra_args", "gpus"), [
    ([], "2"),
    (["--pp-size", "2"], "4"),
    (["--pipeline-parallel-size=2", "--dp-size", "3"], "12"),
    (["--dp-size", "2", "--enable-dp-attention"], "2"),  # attention DP splits the TP GPUs
])
def test_sglang_pods_hold_one_gpu_per_rank(extra_args, gpus):
    engine = SGLANG | {"extraArgs": extra_args}
    implicit = spec_of(engine=engine, decode={"tensorParallelSize": 2})
    assert container(build_decode_deployment(CLUSTER, implicit))["resources"]["limits"]["nvidia.com/gpu"] == gpus
    # The same count, written out, is accepted.
    spec_of(engine=engine, decode={"tensorParallelSize": 2, "resources": {"limits": {"nvidia.com/gpu": gpus}}})


@pytest.mark.parametrize(("extra_args", "gpus"), [
    # SGLang's parser takes aliases and any abbreviation no other option of it shares: `--dp 2`
    # left the pod one GPU short, and SGLang crash-looped on it.
    (["--dp", "2"], "4"),
    (["--dp=3"], "6"),
    (["--data-parallel-size", "2"], "4"),
    (["--data-parallel=2"], "4"),
    (["--pp-s", "2"], "4"),
    (["--pipeline-parallel", "3"], "6"),
    (["--dp", "2", "--enable-dp-attention"], "2"),  # still attention DP, splitting the TP GPUs
    (["--pp-max-micro-batch-size", "4"], "2"),  # another option: no stages
])
def test_sglang_gpus_follow_every_spelling_sglang_takes(extra_args, gpus):
    engine = SGLANG | {"extraArgs": extra_args}
    implicit = spec_of(engine=engine, decode={"tensorParallelSize": 2})
    assert container(build_decode_deployment(CLUSTER, implicit))["resources"]["limits"]["nvidia.com/gpu"] == gpus


def test_a_gpu_request_other_than_its_limit_or_a_fraction_is_an_invalid_spec():
    unequal = {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}
    with pytest.raises(InvalidSpecError, match=re.escape(
            "spec.decode.resources: requests.nvidia.com/gpu (1) must equal limits.nvidia.com/gpu (2): "
            "Kubernetes does not overcommit nvidia.com/gpu")):
        spec_of(engine=SGLANG, decode={"tensorParallelSize": 2, "resources": unequal})
    with pytest.raises(InvalidSpecError, match=re.escape("spec.prefill.resources.limits: nvidia.com/gpu: '1.5' is "
                                                         "not a whole number")):
        spec_of(prefill={"resources": {"limits": {"nvidia.com/gpu": "1.5"}}})


TOLERATION_ERRORS = [
    ({"kee": "gpu"}, "spec.prefill.tolerations.0.kee: Extra inputs are not permitted"),
    ({"key": "gpu", "operator": "In"}, "spec.prefill.tolerations.0.operator: Input should be 'Exists' or 'Equal'"),
    ({"key": "gpu", "effect": "NoSchedul"}, "spec.prefill.tolerations.0.effect: Input should be"),
    ({"key": "gpu type"}, "spec.prefill.tolerations.0.key: String should match pattern"),
    ({"key": "gpu", "value": "x" * 64}, "spec.prefill.tolerations.0.value: String should have at most 63"),
    ({"key": "example.com/" + "k" * 64}, "spec.prefill.tolerations.0.key: 'example.com/" + "k" * 64
     + "': at most 253 characters before the '/' and 63 after it"),
    ({"value": "gpu"}, "spec.prefill.tolerations.0: a toleration without a key needs operator Exists"),
    ({"key": "gpu", "operator": "Exists", "value": "yes"},
     "spec.prefill.tolerations.0: operator Exists takes no value"),
    ({"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30},
     "spec.prefill.tolerations.0: tolerationSeconds needs effect NoExecute"),
]


@pytest.mark.parametrize(("toleration", "says"), TOLERATION_ERRORS, ids=[s for _, s in TOLERATION_ERRORS])
def test_a_toleration_the_api_server_would_refuse_is_an_invalid_spec_naming_the_field(toleration, says):
    with pytest.raises(InvalidSpecError, match=re.escape(says)):
        spec_of(prefill={"tolerations": [toleration]})


def test_the_crd_refuses_a_toleration_with_an_unknown_key_or_value():
    for toleration, where in [({"kee": "gpu"}, "kee"), ({"key": "gpu", "operator": "In"}, "operator"),
                              ({"key": "gpu", "effect": "Never"}, "effect"), ({"key": "a b"}, "key"),
                              ({"key": "gpu", "tolerationSeconds": "30"}, "tolerationSeconds")]:
        found = errors(with_spec(**{"decode.tolerations": [toleration]}))
        assert any(e.startswith("spec.decode.tolerations.0") and where in e for e in found), found


def test_the_crd_checks_tolerations_with_the_operators_patterns():
    items = SCHEMA["properties"]["spec"]["properties"]["gateway"]["properties"]["tolerations"]["items"]
    key, value = items["properties"]["key"], items["properties"]["value"]
    assert (key["pattern"], key["maxLength"]) == (TOLERATION_KEY_PATTERN, TOLERATION_KEY_MAX_LENGTH)
    assert (value["pattern"], value["maxLength"]) == (LABEL_VALUE_PATTERN, LABEL_VALUE_MAX_LENGTH)
    # What a server without strict field validation leaves of {kee: gpu}: refused by both.
    assert any(e.startswith("spec.gateway.tolerations.0:") for e in errors(with_spec(**{"gateway.tolerations": [{}]})))
    with pytest.raises(InvalidSpecError, match=re.escape("spec.gateway.tolerations.0: a toleration without a key")):
        spec_of(gateway={"tolerations": [{}]})
    # Kubernetes' own examples pass both.
    valid = [{"operator": "Exists"}, {"key": "example.com/gpu-type", "operator": "Equal", "value": "h100"},
             {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
              "tolerationSeconds": 300}]
    assert errors(with_spec(**{"gateway.tolerations": valid})) == []
    assert build_gateway_deployment(CLUSTER, spec_of(gateway={"tolerations": valid}))["spec"]["template"]["spec"][
        "tolerations"] == valid


@pytest.mark.parametrize(("affinity", "where"), [
    ({"nodeAfinity": {}}, "spec.gateway.affinity.nodeAfinity"),
    ({"podAntiAffinity": {"preferredDuringScheduling": []}},
     "spec.gateway.affinity.podAntiAffinity.preferredDuringScheduling"),
])
def test_affinity_takes_only_kubernetes_keys(affinity, where):
    doc = with_spec(**{"gateway.affinity": affinity})
    parent, _, key = where.rpartition(".")
    assert any(e.startswith(parent + ":") and repr(key) in e for e in errors(doc)), errors(doc)
    with pytest.raises(InvalidSpecError, match=re.escape(f"{where}: Extra inputs are not permitted")):
        spec_of(**apply_defaults(doc, SCHEMA)["spec"])
