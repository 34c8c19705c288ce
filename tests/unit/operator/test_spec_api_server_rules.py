"""Values the CRD's schema lets through but a Kubernetes 1.30 API server refuses in the pod
template, Service or NetworkPolicy the operator renders from them. Refused there, they would fail
the reconcile part-way (the children before the bad one applied, the workloads after it not: an
edit could roll prefill onto a new length threshold and leave the gateway on the old one), with
only a generic WritesFailing after three tries. Each is an InvalidSpec naming the field instead,
and nothing is applied. The rules are the API server's (ValidateLabels, validateContainerResourceName,
validateEnvVarValueFrom, ValidateLabelSelector, the HugePages rule, the volume sources' required
fields); near misses the API server accepts still pass."""
from __future__ import annotations

import pytest

from laps_operator.naming import ClusterRef
from laps_operator.render.builders import build_children
from laps_operator.spec.cluster import InvalidSpecError, parse_spec

BASE = {"model": {"name": "m", "path": "/models/m"}}
PVC = {"persistentVolumeClaim": {"claimName": "models"}}

REFUSED = [
    ({"prefill": {"nodeSelector": {"gpu type": "a100"}}}, "spec.prefill.nodeSelector: 'gpu type' is not a label"),
    ({"decode": {"nodeSelector": {"gpu": "A100 80GB"}}}, "spec.decode.nodeSelector: gpu: 'A100 80GB' is not a label value"),
    ({"prefill": {"resources": {"limits": {"gpu": 1}}}}, "spec.prefill.resources.limits: gpu: 'gpu' is not a container resource"),
    ({"decode": {"resources": {"requests": {"memroy": "8Gi"}}}}, "'memroy' is not a container resource"),
    ({"prefill": {"resources": {"limits": {"hugepages-2Mi": "1Gi"}}}}, "hugepages need a cpu or memory"),
    ({"engine": {"env": [{"name": "A=B", "value": "x"}]}}, "spec.engine.env: 'A=B' is not an environment variable name"),
    ({"engine": {"env": [{"name": "MY\tVAR", "value": "x"}]}}, "'MY\\tVAR' is not an environment variable name"),
    ({"engine": {"env": [{"name": "CAFÉ", "value": "x"}]}}, "'CAFÉ' is not an environment variable name"),
    ({"engine": {"env": [{"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}},
     "spec.engine.env: A: takes 'value' or 'valueFrom', not both"),
    ({"engine": {"image": "ghcr.io/laps-project/laps:0.1.0 "}}, "spec.engine.image: 'ghcr.io/laps-project/laps:0.1.0 ': an image"),
    ({"model": {**BASE["model"], "volume": {"persistentVolumeClaim": {"claimNam": "models"}}}},
     "spec.model.volume: persistentVolumeClaim needs claimName"),
    ({"model": {**BASE["model"], "volume": PVC, "mountPath": ""}}, "spec.model.mountPath: '': must be an absolute path"),
    ({"model": {**BASE["model"], "volume": PVC, "mountPath": "models"}}, "spec.model.mountPath: 'models': must be an absolute"),
    ({"prefill": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "my app"}}}]}}}},
     "labelSelector.matchLabels: app: 'my app' is not a label value"),
    ({"prefill": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway",
                                                 "labelSelector": {"matchLabels": {"my key": "x"}}}]}},
     "'my key' is not a label"),
    ({"networkPolicy": {"metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "ml ops"}}}]}},
     "spec.networkPolicy.metricsFrom.0.namespaceSelector.matchLabels: team: 'ml ops' is not a label value"),
    ({"networkPolicy": {"gatewayIngress": [{"podSelector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["a b"]}]}}]}}, "app: 'a b' is not a label value"),
    ({"networkPolicy": {"gatewayIngress": [{"podSelector": {"matchExpressions": [
        {"key": "bad key", "operator": "Exists"}]}}]}}, "'bad key' is not a label"),
]


@pytest.mark.parametrize(("spec", "says"), REFUSED, ids=[says[:48] for _, says in REFUSED])
def test_a_value_the_api_server_would_refuse_is_an_invalid_spec_naming_the_field(spec, says):
    with pytest.raises(InvalidSpecError) as refused:
        parse_spec({**BASE, **spec})
    assert says in str(refused.value)


ACCEPTED = [
    {"prefill": {"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "pool": ""}}},
    {"prefill": {"resources": {"limits": {"nvidia.com/gpu": 1, "hugepages-2Mi": "1Gi", "memory": "8Gi"},
                               "requests": {"ephemeral-storage": "10Gi", "cpu": "500m"}}}},
    # Kubernetes 1.32 and later take any printable ASCII but '=' (an older server's refusal of
    # "1X" is the operator's dry run's to report).
    {"engine": {"env": [{"name": "HF_HOME", "value": ""}, {"name": "_x.y-z", "value": "1"}, {"name": "1X", "value": ""},
                        {"name": "NODE", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}},
    {"engine": {"image": "registry.local:5000/laps@sha256:" + "a" * 64}},
    {"model": {**BASE["model"], "volume": {"nfs": {"server": "nas", "path": "/export/models"}}, "mountPath": "/mnt/m"}},
    {"networkPolicy": {"gatewayIngress": [{"podSelector": {"matchExpressions": [
        {"key": "app.kubernetes.io/name", "operator": "NotIn", "values": ["x", "y-1"]}]}}]}},
]


@pytest.mark.parametrize("spec", ACCEPTED)
def test_near_misses_the_api_server_accepts_still_render(spec):
    parsed = parse_spec({**BASE, **spec})
    assert build_children(ClusterRef("c", "ns", "uid"), parsed, "laps-system")
