"""A user's first two moves, end to end: `helm install laps charts/laps`, then
`kubectl apply -f examples/lapscluster.yaml`, against the emulated API server.

Helm installs through its own Go SDK (server-side apply, memory release storage). What the
emulator cannot show: no kubelet runs the operator Deployment the chart creates, so the test
starts the same `laps operator` process itself (one namespace, loopback ports); the CRD's CEL
rules are not evaluated (the operator re-checks them and reports InvalidSpec)."""
from __future__ import annotations

import pathlib

import helm_python
import kubernetes
import yaml

from tests.e2e.operator.conftest import wait_for

REPO = pathlib.Path(__file__).resolve().parents[3]
GROUP, VERSION, PLURAL, NS = "laps.io", "v1alpha1", "lapsclusters", "default"


def test_helm_install_then_apply_the_example_gives_a_reconciled_cluster(kube_api, start_operator):
    api = kube_api.api_client()
    apps = kubernetes.client.AppsV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    helm = helm_python.Config(kubeconfig_path=str(kube_api.kubeconfig), storage_driver="memory",
                              namespace="laps-system")
    try:
        release = helm.install(str(REPO / "charts" / "laps"), "laps", {}, namespace="laps-system",
                               create_namespace=True)
        assert release["status"] == "deployed"
        operator = apps.read_namespaced_deployment("laps", "laps-system")
        assert operator.spec.template.spec.containers[0].args[0] == "operator"
        # The chart's CRD is served: LAPSClusters can be listed before any exist.
        assert custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"] == []

        start_operator()  # what the chart's Deployment would run, were there a kubelet
        example = yaml.safe_load((REPO / "examples" / "lapscluster.yaml").read_text())
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, example)
        name = example["metadata"]["name"]

        sts = wait_for(lambda: apps.read_namespaced_stateful_set(f"{name}-prefill", NS), "prefill StatefulSet")
        assert sts.spec.replicas == example["spec"]["prefill"]["replicas"]
        status = wait_for(lambda: custom.get_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, name).get("status", {}).get("phase"), "a phase in status")
        assert status in ("Progressing", "Ready")

        # Act as the StatefulSet controller (the emulator has none): create its pods, so the
        # operator labels them; then show what a reviewer would see with kubectl (`pytest -s`).
        core = kubernetes.client.CoreV1Api(api)
        for i in range(sts.spec.replicas):
            core.create_namespaced_pod(NS, {"metadata": {
                "name": f"{name}-prefill-{i}", "labels": dict(sts.spec.template.metadata.labels),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "controller": True,
                                     "name": sts.metadata.name, "uid": sts.metadata.uid}]},
                "spec": {"containers": [{"name": "engine", "image": "laps"}]}})
        groups = wait_for(lambda: (custom.get_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, name)
                                   .get("status", {}).get("groupSizes")), "group sizes in status")
        assert groups == {"short": 2, "long": 2}
        print_cluster(api, name, custom.get_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, name))

        helm.uninstall("laps")
        wait_for(lambda: not apps.list_namespaced_deployment("laps-system").items, "operator Deployment removed")
    finally:
        helm.close()


def print_cluster(api, name: str, cluster: dict) -> None:
    """Roughly `kubectl get laps,all -l laps.io/cluster=NAME` and the prefill pods' groups."""
    core, apps = kubernetes.client.CoreV1Api(api), kubernetes.client.AppsV1Api(api)
    selector = f"laps.io/cluster={name}"
    status = cluster["status"]
    print(f"\nlapscluster/{name}: phase={status.get('phase')} groupSizes={status.get('groupSizes')}")
    for cond in status.get("conditions", []):
        print(f"  condition {cond['type']}={cond['status']} ({cond.get('reason')})")
    for kind, items in (("statefulset", apps.list_namespaced_stateful_set(NS, label_selector=selector).items),
                        ("deployment", apps.list_namespaced_deployment(NS, label_selector=selector).items),
                        ("service", core.list_namespaced_service(NS, label_selector=selector).items),
                        ("configmap", core.list_namespaced_config_map(NS, label_selector=selector).items)):
        for obj in items:
            print(f"{kind}/{obj.metadata.name}")
    for pod in core.list_namespaced_pod(NS, label_selector=f"{selector},laps.io/role=prefill").items:
        print(f"pod/{pod.metadata.name}  laps.io/prefill-group={pod.metadata.labels.get('laps.io/prefill-group')}")
