"""A platform engineer's `kubectl describe lapscluster` on a cluster that does not come up: the
Ready condition says why, from the pods, and follows them as they change.

What the emulator cannot show, and who plays it: no scheduler or kubelet, so no image is really
pulled and no probe runs; the test writes the pod status a kubelet writes (an image it cannot
pull, a container running whose readiness probe has not passed, then ready) and the StatefulSet
status its controller writes. The text of the kubelet's messages is the test's copy of theirs.
"""
from __future__ import annotations

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_operator_e2e import MERGE, NS, Cluster

# Well under the operator's resync (60 s): the condition follows the pod events themselves.
PROMPTLY = 20.0


def kubelet_writes(cluster: Cluster, pod: str, ready: bool, container_state: dict) -> None:
    cluster.core.patch_namespaced_pod_status(pod, NS, {"status": {
        "phase": "Running" if ready or "running" in container_state else "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"},
                       {"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "engine", "image": cluster.statefulset().spec.template.spec.containers[0].image,
                               "imageID": "", "ready": ready, "restartCount": 0, "state": container_state}]}},
        _content_type=MERGE)


def test_the_ready_condition_names_a_pod_that_cannot_pull_its_image_until_it_runs(kube_api, start_operator):
    start_operator()
    cluster = Cluster(kube_api, "why")
    cluster.create({"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster", "metadata": {"name": "why"},
                    "spec": {"model": {"name": "m", "path": "/models/m.gguf"}, "prefill": {"replicas": 2}}})
    image = wait_for(cluster.statefulset, "the prefill StatefulSet").spec.template.spec.containers[0].image
    cluster.act_as_statefulset_controller()
    wait_for(lambda: len(cluster.pod_groups()) == 2 and all(cluster.pod_groups().values()), "both pods grouped")

    kubelet_writes(cluster, "why-prefill-0", False, {"waiting": {
        "reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}})
    kubelet_writes(cluster, "why-prefill-1", False, {"running": {"startedAt": "2026-01-01T00:00:00Z"}})
    pulling = f'prefill 0/2 [1 pod ImagePullBackOff: Back-off pulling image "{image}"; 1 pod starting]'
    ready = wait_for(lambda: pulling in (c := cluster.condition("Ready") or {}).get("message", "") and c,
                     "the Ready condition to name the image pull", timeout=PROMPTLY)
    assert ready["status"] == "False" and ready["reason"] == "NotReady"
    assert "decode 0/1 [no pods yet]" in ready["message"]   # no ReplicaSet controller here

    # The image is fixed (a pull secret added): the pod runs and passes its probe.
    kubelet_writes(cluster, "why-prefill-0", True, {"running": {"startedAt": "2026-01-01T00:01:00Z"}})
    wait_for(lambda: "prefill 0/2 [1 pod starting]" in cluster.condition("Ready")["message"],
             "the image pull gone from the Ready condition", timeout=PROMPTLY)

    cluster.report_ready()
    wait_for(lambda: cluster.condition("Ready")["message"] == "all prefill, decode and gateway replicas are ready",
             "Ready", timeout=PROMPTLY)


def test_the_ready_condition_names_why_the_statefulset_cannot_create_pods_until_it_can(kube_api, start_operator):
    """A ResourceQuota (or Pod Security, or a PriorityClass that does not exist) refuses the
    prefill pods. A StatefulSet keeps no condition for that, only a FailedCreate Event: the
    condition reads it from there. The test plays the StatefulSet controller: its Event, and the
    status it writes on each sync (which the operator watches)."""
    start_operator()
    cluster = Cluster(kube_api, "quota")
    cluster.create({"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster", "metadata": {"name": "quota"},
                    "spec": {"model": {"name": "m", "path": "/models/m.gguf"}, "prefill": {"replicas": 2}}})
    sts = wait_for(cluster.statefulset, "the prefill StatefulSet")
    refusal = ('pods "quota-prefill-0" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, '
               'used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8')
    cluster.core.create_namespaced_event(NS, {
        "metadata": {"name": "quota-prefill.1"}, "type": "Warning", "reason": "FailedCreate",
        "involvedObject": {"apiVersion": "apps/v1", "kind": "StatefulSet", "namespace": NS,
                           "name": sts.metadata.name, "uid": sts.metadata.uid},
        "message": f"create Pod quota-prefill-0 in StatefulSet quota-prefill failed error: {refusal}",
        "source": {"component": "statefulset-controller"}, "count": 3,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:09Z"})
    cluster.apps.patch_namespaced_stateful_set_status(sts.metadata.name, NS, {"status": {
        "observedGeneration": sts.metadata.generation, "replicas": 0}}, _content_type=MERGE)
    said = wait_for(lambda: "prefill 0/2 [FailedCreate: " in (c := cluster.condition("Ready") or {}).get("message", "")
                    and c["message"], "the Ready condition to name the refusal", timeout=PROMPTLY)
    assert f"prefill 0/2 [FailedCreate: {refusal}"[:120] in said

    # The quota raised: the controller creates both pods, and the refusal is history.
    cluster.act_as_statefulset_controller()
    cluster.apps.patch_namespaced_stateful_set_status(sts.metadata.name, NS, {"status": {"replicas": 2}},
                                                       _content_type=MERGE)
    wait_for(lambda: "FailedCreate" not in cluster.condition("Ready")["message"]
             and "prefill 0/2 [2 pods" in cluster.condition("Ready")["message"],
             "the refusal gone from the Ready condition", timeout=PROMPTLY)
