"""Updates remove what the spec no longer asks for (`kubectl apply` semantics), and what others
wrote stays: the real operator against the real API server (its merge and strategic-merge patch
semantics, not an emulation of them), driven through the official client as a user would."""
from __future__ import annotations

import json

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_operator_e2e import NS, Cluster, example

LAST_APPLIED = "laps.io/last-applied"
OMP = {"name": "OMP_NUM_THREADS", "value": "2"}
DEBUG = {"name": "LAPS_DEBUG", "value": "1"}
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "prefill", "effect": "NoSchedule"}


def test_fields_removed_from_the_spec_leave_the_statefulset_and_others_labels_stay(kube_api, start_operator):
    start_operator()
    cluster = Cluster(kube_api, "prune")
    body = example("prune")
    body["spec"]["engine"].update(env=[OMP, DEBUG], extraArgs=["--log-level", "debug"])
    body["spec"]["prefill"].update(nodeSelector={"pool": "prefill"}, tolerations=[TOLERATION])
    cluster.create(body)

    sts = wait_for(cluster.statefulset, "the prefill StatefulSet")
    pod = sts.spec.template.spec
    assert pod.node_selector == {"pool": "prefill"} and pod.tolerations[0].key == "dedicated"
    assert {"OMP_NUM_THREADS", "LAPS_DEBUG"} <= {e.name for e in pod.containers[0].env}
    assert pod.containers[0].args[-2:] == ["--log-level", "debug"]
    recorded = json.loads(sts.metadata.annotations[LAST_APPLIED])
    assert recorded["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "prefill"}

    # Someone else labels the StatefulSet (a cost-allocation tool, `kubectl label`...).
    cluster.apps.patch_namespaced_stateful_set("prune-prefill", NS, {"metadata": {"labels": {"team": "ml"}}})
    sts_uid = sts.metadata.uid

    # The user drops the node selector, the tolerations, an env var and the extra args.
    cluster.patch_spec({"engine": {"env": [OMP], "extraArgs": []},
                        "prefill": {"nodeSelector": None, "tolerations": None}})

    def pruned():
        pod = cluster.statefulset().spec.template.spec
        names = {e.name for e in pod.containers[0].env}
        return (pod.node_selector is None and pod.tolerations is None and "LAPS_DEBUG" not in names
                and "--log-level" not in pod.containers[0].args)

    wait_for(pruned, "nodeSelector, tolerations, LAPS_DEBUG and --log-level gone from the StatefulSet")
    sts = cluster.statefulset()
    assert sts.metadata.uid == sts_uid  # updated in place, not recreated
    assert sts.metadata.labels["team"] == "ml"
    assert sts.metadata.labels["laps.io/role"] == "prefill"
    assert "OMP_NUM_THREADS" in {e.name for e in sts.spec.template.spec.containers[0].env}
    assert "nodeSelector" not in json.loads(sts.metadata.annotations[LAST_APPLIED])["spec"]["template"]["spec"]

    # Adding the selector back restores it.
    cluster.patch_spec({"prefill": {"nodeSelector": {"pool": "big"}}})
    wait_for(lambda: cluster.statefulset().spec.template.spec.node_selector == {"pool": "big"},
             "the new nodeSelector on the StatefulSet")
    assert cluster.statefulset().metadata.labels["team"] == "ml"


def test_service_and_pod_metadata_follow_the_spec_and_what_others_wrote_stays(kube_api, start_operator):
    start_operator()
    cluster = Cluster(kube_api, "meta")
    internal = {"networking.gke.io/load-balancer-type": "Internal"}
    no_mesh = {"sidecar.istio.io/inject": "false"}
    body = example("meta")
    body["spec"]["gateway"].update(serviceType="LoadBalancer", serviceAnnotations=internal)
    body["spec"]["prefill"].update(podAnnotations=no_mesh, podLabels={"team": "ml"})
    cluster.create(body)

    service = wait_for(lambda: cluster.services().get("meta-gateway"), "the gateway Service")
    assert service.spec.type == "LoadBalancer" and internal.items() <= service.metadata.annotations.items()
    template = wait_for(cluster.statefulset, "the prefill StatefulSet").spec.template.metadata
    assert template.annotations == no_mesh
    assert template.labels["team"] == "ml" and template.labels["laps.io/role"] == "prefill"
    gateway = wait_for(lambda: cluster.apps.read_namespaced_deployment("meta-gateway", NS), "the gateway")
    # The cloud's controller records its load balancer on the Service.
    cluster.core.patch_namespaced_service("meta-gateway", NS, {"metadata": {"annotations": {"example.com/lb-id": "7"}}})

    cluster.patch_spec({"gateway": {"serviceAnnotations": None},
                        "prefill": {"podAnnotations": None, "podLabels": None}})

    def pruned():
        annotations = cluster.services()["meta-gateway"].metadata.annotations
        template = cluster.statefulset().spec.template.metadata
        done = cluster.status().get("observedGeneration") == cluster.get()["metadata"]["generation"]
        return (done and "networking.gke.io/load-balancer-type" not in annotations and not template.annotations
                and "team" not in template.labels and annotations)

    annotations = wait_for(pruned, "the annotations and label gone from the Service and the pod template")
    assert annotations["example.com/lb-id"] == "7"
    assert cluster.statefulset().spec.template.metadata.labels["laps.io/role"] == "prefill"
    # The Service's annotations are not the gateway pods': they did not roll.
    rolled = cluster.apps.read_namespaced_deployment("meta-gateway", NS).metadata.generation
    assert rolled == gateway.metadata.generation
