"""Day 2: editing a running LAPSCluster, as its operator would with `kubectl edit`.

What the emulator cannot show, and who plays it: no StatefulSet/Deployment controller, so the
test writes the workloads' status as those controllers would during a rollout (the new
generation observed, some replicas updated, a surge pod not ready yet) and creates or deletes
the prefill pods a StatefulSet would; no kubelet, so no pod really restarts (a real rollout
recreates each prefill pod, which then gets its recorded group back: see
test_operator_e2e.test_example_cluster_lifecycle); CEL rules are not evaluated (the specs
here pass them).
"""
from __future__ import annotations

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_operator_e2e import MERGE, NS, Cluster, example

NEW_IMAGE = "registry.example.com/laps:0.2.0"


def arg(container, flag: str) -> str:
    return container.args[container.args.index(flag) + 1]


def running(kube_api, body: dict) -> tuple[Cluster, dict[str, str]]:
    """`body` created, its prefill pods made as the StatefulSet controller would, and labelled
    by the operator: the first half short, the rest long (the groups are returned)."""
    name = body["metadata"]["name"]
    cluster = Cluster(kube_api, name)
    cluster.create(body)
    wait_for(cluster.statefulset, "the prefill StatefulSet")
    cluster.act_as_statefulset_controller()
    replicas = cluster.statefulset().spec.replicas
    groups = {f"{name}-prefill-{i}": "short" if i < replicas // 2 else "long" for i in range(replicas)}
    wait_for(lambda: cluster.pod_groups() == groups, "initial groups")
    return cluster, groups


def test_an_edit_patches_in_place_keeps_the_groups_and_is_progressing_until_rolled_out(kube_api, start_operator):
    start_operator()
    cluster, groups = running(kube_api, example("edit"))
    cluster.report_ready()
    wait_for(lambda: cluster.status().get("phase") == "Ready", "phase Ready")
    sts_uid = cluster.statefulset().metadata.uid
    gateway_uid = cluster.apps.read_namespaced_deployment("edit-gateway", NS).metadata.uid
    pod_versions = {p.metadata.name: p.metadata.resource_version for p in cluster.core.list_namespaced_pod(NS).items}

    cluster.patch_spec({"engine": {"image": NEW_IMAGE}, "gateway": {"image": NEW_IMAGE},
                        "laps": {"lengthThreshold": 512}})

    def gateway():
        return cluster.apps.read_namespaced_deployment("edit-gateway", NS)

    wait_for(lambda: arg(gateway().spec.template.spec.containers[0], "--length-threshold") == "512",
             "the gateway's new threshold")
    engine = cluster.statefulset().spec.template.spec.containers[0]
    assert engine.image == NEW_IMAGE and arg(engine, "--length-threshold") == "512"
    assert gateway().spec.template.spec.containers[0].image == NEW_IMAGE
    assert (cluster.statefulset().metadata.uid, gateway().metadata.uid) == (sts_uid, gateway_uid)

    # Until their controllers have seen the new generation, the workloads are not rolled out.
    wait_for(lambda: cluster.status().get("phase") == "Progressing", "phase Progressing after the edit")
    assert "gateway update not yet seen" in cluster.condition("Progressing")["message"]
    # The controllers roll out: decode done, one prefill pod updated, the gateway's new pod up
    # beside the old one but not ready (a bad image would leave it so). The old pods still serve.
    sts, gw = cluster.statefulset(), gateway()
    decode = cluster.apps.read_namespaced_deployment("edit-decode", NS)
    cluster.apps.patch_namespaced_deployment_status("edit-decode", NS, {"status": {
        "observedGeneration": decode.metadata.generation, "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2}},
        _content_type=MERGE)
    cluster.apps.patch_namespaced_stateful_set_status("edit-prefill", NS, {"status": {
        "observedGeneration": sts.metadata.generation, "replicas": 4, "readyReplicas": 4, "updatedReplicas": 1}},
        _content_type=MERGE)
    cluster.apps.patch_namespaced_deployment_status("edit-gateway", NS, {"status": {
        "observedGeneration": gw.metadata.generation, "replicas": 2, "readyReplicas": 1, "updatedReplicas": 1}},
        _content_type=MERGE)
    # (The pods' bracket: no kubelet here writes their status.)
    progressing = wait_for(lambda: (c := cluster.condition("Progressing"))["message"] == (
        "rolling out: prefill 1/4 updated [4 pods not scheduled yet], gateway 1 old pods still running") and c,
        "the rollout in Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
    assert cluster.status()["phase"] == "Progressing"
    assert cluster.condition("Ready")["status"] == "True"   # still serving, on the old pods
    # Nothing relabelled: a knob or image change is no reason to move a pod.
    assert cluster.pod_groups() == groups
    assert {p.metadata.name: p.metadata.resource_version
            for p in cluster.core.list_namespaced_pod(NS).items} == pod_versions

    cluster.report_ready()
    wait_for(lambda: cluster.status().get("phase") == "Ready", "phase Ready once every pod is updated")
    assert cluster.condition("Progressing")["status"] == "False"


def test_a_scale_down_keeps_min_per_group_in_each_group(kube_api, start_operator):
    start_operator()
    body = example("floor", prefill={"replicas": 6})
    body["spec"]["laps"]["allocation"]["minPerGroup"] = 2
    cluster, _ = running(kube_api, body)
    # As after the allocation loop moved pod 5 to short (long at its minimum of 2 from then on).
    cluster.custom.patch_namespaced_custom_object_status("laps.io", "v1alpha1", NS, "lapsclusters", "floor", {
        "status": {"groups": {"short": [f"floor-prefill-{i}" for i in (0, 1, 2, 5)],
                              "long": ["floor-prefill-3", "floor-prefill-4"]}}}, _content_type=MERGE)
    cluster.core.patch_namespaced_pod("floor-prefill-5", NS, {"metadata": {"labels": {"laps.io/prefill-group": "short"}}})

    cluster.patch_spec({"prefill": {"replicas": 4}})
    wait_for(lambda: cluster.statefulset().spec.replicas == 4, "StatefulSet scaled to 4")
    cluster.act_as_statefulset_controller()
    wait_for(lambda: cluster.status().get("groupSizes") == {"short": 2, "long": 2},
             "each group at its minimum of 2", timeout=30)
    assert cluster.status()["groups"] == {"short": ["floor-prefill-0", "floor-prefill-1"],
                                          "long": ["floor-prefill-2", "floor-prefill-3"]}
    wait_for(lambda: cluster.pod_groups() == {"floor-prefill-0": "short", "floor-prefill-1": "short",
                                              "floor-prefill-2": "long", "floor-prefill-3": "long"}, "labels")
    wait_for(lambda: any(r == "GroupRebalanced" and "floor-prefill-2 moved short -> long" in m
                         for r, m in cluster.events()), "a GroupRebalanced event")


def test_a_pod_recreated_while_an_edit_is_invalid_gets_its_recorded_group_back(kube_api, start_operator):
    """A real API server lets this edit through (no CEL rule counts GPUs); the operator answers
    InvalidSpec and leaves the running children as they are. They must keep working meanwhile:
    a prefill pod the StatefulSet recreates (eviction, node drain) gets its group back."""
    start_operator()
    cluster, groups = running(kube_api, example("typo"))
    template = cluster.statefulset().spec.template.to_dict()

    # One GPU per builtin CUDA engine: asking for two is refused by the operator, not the server.
    cluster.patch_spec({"engine": {"device": "cuda"}, "prefill": {"resources": {"limits": {"nvidia.com/gpu": 2}}}})
    invalid = wait_for(lambda: (c := cluster.condition("InvalidSpec")) and c["status"] == "True" and c,
                       "the InvalidSpec condition")
    assert "nvidia.com/gpu (2)" in invalid["message"]

    for pod in ("typo-prefill-1", "typo-prefill-2"):
        cluster.core.delete_namespaced_pod(pod, NS)
    wait_for(lambda: len(cluster.pod_groups()) == 2, "two pods gone")
    cluster.act_as_statefulset_controller()
    wait_for(lambda: cluster.pod_groups() == groups, "the recreated pods back in their groups", timeout=30)
    assert cluster.statefulset().spec.template.to_dict() == template   # the invalid edit changed nothing
    assert cluster.status()["groups"] == {"short": ["typo-prefill-0", "typo-prefill-1"],
                                          "long": ["typo-prefill-2", "typo-prefill-3"]}
