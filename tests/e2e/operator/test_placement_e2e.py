"""Pod placement and GPU counts end to end. The emulator prunes and validates CRs against the
CRD's schema but evaluates no rule that spans fields, as a real API server without them (an
older CRD) would: a spec whose workloads the API server would refuse on every write (more GPUs
than ranks, a toleration against Kubernetes' rules) must get the InvalidSpec condition naming the
field, and no children, instead."""
from __future__ import annotations

import kubernetes
import pytest

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_operator_e2e import NS, Cluster, example

SGLANG = {"backend": "sglang", "image": "ghcr.io/laps-project/laps-engine-sglang:0.1.0", "device": "cuda"}


def invalid_spec(cluster: Cluster) -> str:
    condition = wait_for(lambda: cluster.condition("InvalidSpec"), "the InvalidSpec condition")
    assert condition["status"] == "True" and cluster.status()["phase"] == "Invalid"
    assert not cluster.apps.list_namespaced_stateful_set(NS).items
    assert not cluster.apps.list_namespaced_deployment(NS).items
    return condition["message"]


def test_a_gpu_request_for_more_gpus_than_ranks_is_refused_and_once_fixed_becomes_the_limit(kube_api, start_operator):
    start_operator()
    cluster = Cluster(kube_api, "gpus")
    gpus = {"requests": {"nvidia.com/gpu": 2, "memory": "8Gi"}}
    cluster.create(example("gpus", engine=SGLANG, prefill={"replicas": 4, "resources": gpus}))
    message = invalid_spec(cluster)
    assert "prefill.resources nvidia.com/gpu (2) must equal prefill.tensorParallelSize (1)" in message

    cluster.patch_spec({"prefill": {"tensorParallelSize": 2}})
    sts = wait_for(cluster.statefulset, "the prefill StatefulSet after the fix")
    resources = sts.spec.template.spec.containers[0].resources
    assert resources.requests == {"nvidia.com/gpu": "2", "memory": "8Gi"}
    assert resources.limits == {"nvidia.com/gpu": "2"}  # the request: Kubernetes asks them equal
    wait_for(lambda: cluster.condition("InvalidSpec")["status"] == "False", "InvalidSpec cleared")


def test_a_misspelt_toleration_is_refused_at_the_door(kube_api, start_operator):
    # The Python client asks for no strict field validation: the server prunes the unknown `kee`,
    # and the empty toleration left is refused, naming it (kubectl's strict default names `kee`).
    start_operator()  # installs the CRD
    cluster = Cluster(kube_api, "typo")
    with pytest.raises(kubernetes.client.ApiException) as refused:
        cluster.create(example("typo", prefill={"replicas": 2, "tolerations": [{"kee": "gpu"}]}))
    assert refused.value.status == 422 and "spec.prefill.tolerations[0]" in refused.value.body


def test_a_toleration_kubernetes_refuses_is_named_and_every_pod_gets_pull_secrets_and_placement(
        kube_api, start_operator):
    start_operator()
    cluster = Cluster(kube_api, "placed")
    # Field by field valid, so the schema passes it; the API server's Toleration rules do not.
    wrong = {"key": "gpu", "operator": "Exists", "value": "true"}
    cluster.create(example("placed", prefill={"replicas": 2, "tolerations": [wrong]}))
    assert "spec.prefill.tolerations.0: operator Exists takes no value" in invalid_spec(cluster)

    # The fix, as a user would send it: the whole list replaced (merge patch).
    cluster.patch_spec({"prefill": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}})
    sts = wait_for(cluster.statefulset, "the prefill StatefulSet after the fix")
    assert [(t.key, t.operator, t.value) for t in sts.spec.template.spec.tolerations] == [("gpu", "Exists", None)]
    gateway = wait_for(lambda: cluster.apps.read_namespaced_deployment("placed-gateway", NS), "the gateway")
    pod = gateway.spec.template.spec
    # examples/lapscluster.yaml's imagePullSecrets and gateway placement.
    assert [s.name for s in pod.image_pull_secrets] == ["registry-credentials"]
    assert pod.node_selector == {"kubernetes.io/os": "linux"}
    assert [(t.key, t.value, t.effect) for t in pod.tolerations] == [("dedicated", "gateway", "NoSchedule")]
    assert pod.affinity.pod_anti_affinity.preferred_during_scheduling_ignored_during_execution[0].weight == 100
    decode = cluster.apps.read_namespaced_deployment("placed-decode", NS).spec.template.spec
    assert [s.name for s in decode.image_pull_secrets] == ["registry-credentials"] and decode.tolerations is None
    assert [s.name for s in sts.spec.template.spec.image_pull_secrets] == ["registry-credentials"]
