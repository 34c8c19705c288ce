"""The operator end to end: `laps operator` (kopf) against the Kubernetes API emulator, driven
with the official `kubernetes` client as a user would.

The emulator runs no controllers and no kubelet, so where a real cluster would create pods for
a StatefulSet or report ready replicas, the test does it (see `act_as_statefulset_controller`
and `report_ready`); the operator never sees a difference.
"""
from __future__ import annotations

import copy

import kubernetes
import yaml

from tests.e2e.operator.conftest import REPO, wait_for

NS = "default"
GROUP, VERSION, PLURAL = "laps.io", "v1alpha1", "lapsclusters"
GROUP_LABEL = "laps.io/prefill-group"
MERGE = "application/merge-patch+json"
NETPOL = "networking.k8s.io/v1/networkpolicies"


def example(name: str = "smollm2", **spec_changes) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "lapscluster.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"].update(copy.deepcopy(spec_changes))
    return doc


def reconciled_without_allocation(kube_api, name: str) -> Cluster:
    """The example cluster `name` with the allocation loop off, once its first spec is reconciled."""
    cluster = Cluster(kube_api, name)
    body = example(name)
    body["spec"]["laps"]["allocation"]["enabled"] = False
    cluster.create(body)
    wait_for(lambda: cluster.status().get("observedGeneration") == 1, "the first reconcile")
    return cluster


class Cluster:
    """A user's view of one LAPSCluster through the official client."""

    def __init__(self, kube_api, name: str):
        client = kube_api.api_client()
        self.name = name
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.core = kubernetes.client.CoreV1Api(client)
        self.apps = kubernetes.client.AppsV1Api(client)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(client)

    def create(self, body: dict) -> dict:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)

    def get(self) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, self.name)

    def patch_spec(self, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, self.name, {"spec": spec},
                                                   _content_type=MERGE)

    def status(self) -> dict:
        return self.get().get("status") or {}

    def condition(self, type_: str) -> dict | None:
        return next((c for c in self.status().get("conditions") or [] if c["type"] == type_), None)

    def statefulset(self):
        return self.apps.read_namespaced_stateful_set(f"{self.name}-prefill", NS)

    def pod_groups(self) -> dict[str, str | None]:
        pods = self.core.list_namespaced_pod(NS, label_selector=f"laps.io/cluster={self.name},laps.io/role=prefill")
        return {p.metadata.name: (p.metadata.labels or {}).get(GROUP_LABEL) for p in pods.items}

    def act_as_statefulset_controller(self, ready: bool = False) -> None:
        """Create the pods a StatefulSet controller would (template labels, owner reference) and
        delete those beyond `replicas`, as Kubernetes does on scale-down. `ready`: also report
        each new pod Running and Ready, as its kubelet would once the readiness probe passes
        (the allocation loop moves only pods that serve)."""
        sts = self.statefulset()
        existing = set(self.pod_groups())
        wanted = {f"{sts.metadata.name}-{i}" for i in range(sts.spec.replicas)}
        for name in sorted(wanted - existing):
            self.core.create_namespaced_pod(NS, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": dict(sts.spec.template.metadata.labels),
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                  "name": sts.metadata.name, "uid": sts.metadata.uid,
                                                  "controller": True}]},
                "spec": {"containers": [{"name": "engine", "image": sts.spec.template.spec.containers[0].image}]},
            })
            if ready:
                self.core.patch_namespaced_pod_status(name, NS, {"status": {
                    "phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}})
        for name in sorted(existing - wanted):
            self.core.delete_namespaced_pod(name, NS)

    def report_ready(self) -> None:
        """What the workload controllers would write once every pod passes its readiness probe."""
        for kind, name in (("stateful_set", f"{self.name}-prefill"), ("deployment", f"{self.name}-decode"),
                           ("deployment", f"{self.name}-gateway")):
            obj = getattr(self.apps, f"read_namespaced_{kind}")(name, NS)
            n = obj.spec.replicas
            getattr(self.apps, f"patch_namespaced_{kind}_status")(
                name, NS, {"status": {"observedGeneration": obj.metadata.generation, "replicas": n,
                                      "readyReplicas": n, "availableReplicas": n, "updatedReplicas": n}},
                _content_type=MERGE)

    def services(self) -> dict:
        items = self.core.list_namespaced_service(NS, label_selector=f"laps.io/cluster={self.name}").items
        return {s.metadata.name: s for s in items}

    def events(self) -> list[tuple[str, str]]:
        items = self.core.list_namespaced_event(NS).items
        return [(e.reason, e.message) for e in items if e.involved_object.name == self.name]


def groups_are(cluster: Cluster, expected: dict[str, str]):
    return lambda: cluster.pod_groups() == expected


def test_example_cluster_lifecycle(kube_api, start_operator):
    start_operator()
    cluster = Cluster(kube_api, "smollm2")
    created = cluster.create(example())
    uid = created["metadata"]["uid"]

    # Children appear with the contract's names, labels and owner references.
    sts = wait_for(cluster.statefulset, "the prefill StatefulSet")
    assert sts.spec.replicas == 4
    assert sts.metadata.owner_references[0].uid == uid and sts.metadata.owner_references[0].kind == "LAPSCluster"
    assert sts.metadata.labels["laps.io/role"] == "prefill"
    assert GROUP_LABEL not in sts.spec.template.metadata.labels
    services = wait_for(lambda: len(cluster.services()) == 5 and cluster.services(), "the 5 services")
    assert set(services) == {"smollm2-prefill", "smollm2-prefill-short", "smollm2-prefill-long",
                             "smollm2-decode", "smollm2-gateway"}
    assert services["smollm2-prefill-long"].spec.selector[GROUP_LABEL] == "long"
    assert services["smollm2-prefill"].spec.cluster_ip == "None"
    decode = wait_for(lambda: cluster.apps.read_namespaced_deployment("smollm2-decode", NS), "decode")
    gateway = wait_for(lambda: cluster.apps.read_namespaced_deployment("smollm2-gateway", NS), "gateway")
    assert decode.spec.replicas == 2
    gateway_args = gateway.spec.template.spec.containers[0].args
    assert gateway_args[gateway_args.index("--prefill-short-service") + 1] == "smollm2-prefill-short"
    assert gateway.spec.template.spec.service_account_name == "smollm2-gateway"
    role = wait_for(lambda: cluster.rbac.read_namespaced_role("smollm2-gateway", NS), "gateway role")
    assert "endpointslices" in role.rules[0].resources
    cm = wait_for(lambda: cluster.core.read_namespaced_config_map("smollm2-config", NS), "config map")
    for obj in (decode, gateway, role, cm, *services.values()):
        assert [o.uid for o in obj.metadata.owner_references] == [uid]
        assert obj.metadata.labels["app.kubernetes.io/managed-by"] == "laps-operator"
    # NetworkPolicies (on by default) around each role's pods, owned like the rest.
    policies = {role: wait_for(lambda r=role: kube_api.find(NETPOL, NS, f"smollm2-{r}"), f"{role} policy")
                for role in ("prefill", "decode", "gateway")}
    for role, policy in policies.items():
        assert policy["spec"]["podSelector"]["matchLabels"] == {"laps.io/cluster": "smollm2", "laps.io/role": role}
        assert [o["uid"] for o in policy["metadata"]["ownerReferences"]] == [uid]
    assert {p["port"] for r in policies["prefill"]["spec"]["ingress"] for p in r["ports"]} == {30000, 8998}

    # Pods as the StatefulSet controller would make them: first half short, rest long.
    cluster.act_as_statefulset_controller()
    wait_for(groups_are(cluster, {"smollm2-prefill-0": "short", "smollm2-prefill-1": "short",
                                  "smollm2-prefill-2": "long", "smollm2-prefill-3": "long"}), "initial groups")
    assert cluster.status()["groups"] == {"short": ["smollm2-prefill-0", "smollm2-prefill-1"],
                                          "long": ["smollm2-prefill-2", "smollm2-prefill-3"]}
    assert wait_for(lambda: cluster.status().get("phase") == "Progressing", "phase Progressing")
    cluster.report_ready()
    wait_for(lambda: cluster.status().get("phase") == "Ready", "phase Ready")
    assert cluster.condition("Ready")["status"] == "True"
    assert cluster.condition("InvalidSpec")["status"] == "False"
    assert cluster.status()["observedGeneration"] == cluster.get()["metadata"]["generation"]

    # A deleted prefill pod comes back (as the controller would recreate it) with its group.
    cluster.core.delete_namespaced_pod("smollm2-prefill-1", NS)
    wait_for(lambda: "smollm2-prefill-1" not in cluster.pod_groups(), "pod 1 gone")
    cluster.act_as_statefulset_controller()
    wait_for(lambda: cluster.pod_groups().get("smollm2-prefill-1") == "short", "pod 1 back in short")

    # Scale up 4 -> 6: in place (same StatefulSet), new pods join the smaller group.
    sts_uid = cluster.statefulset().metadata.uid
    cluster.patch_spec({"prefill": {"replicas": 6}})
    wait_for(lambda: cluster.statefulset().spec.replicas == 6, "StatefulSet scaled to 6")
    assert cluster.statefulset().metadata.uid == sts_uid
    cluster.act_as_statefulset_controller()
    wait_for(lambda: cluster.pod_groups().get("smollm2-prefill-4") == "short"
             and cluster.pod_groups().get("smollm2-prefill-5") == "long", "pods 4, 5 grouped")
    assert cluster.status()["groupSizes"] == {"short": 3, "long": 3}

    # Scale down 6 -> 3: departed pods leave the status; both groups keep a pod.
    cluster.patch_spec({"prefill": {"replicas": 3}})
    wait_for(lambda: cluster.statefulset().spec.replicas == 3, "StatefulSet scaled to 3")
    cluster.act_as_statefulset_controller()
    wait_for(lambda: cluster.status().get("groups") == {"short": ["smollm2-prefill-0", "smollm2-prefill-1"],
                                                        "long": ["smollm2-prefill-2"]}, "status after scale-down")
    assert cluster.pod_groups() == {"smollm2-prefill-0": "short", "smollm2-prefill-1": "short",
                                    "smollm2-prefill-2": "long"}

    # A knob change rolls the engines in place: same object, new args.
    cluster.patch_spec({"laps": {"lengthThreshold": 512}})

    def threshold() -> str:
        args = cluster.statefulset().spec.template.spec.containers[0].args
        return args[args.index("--length-threshold") + 1]

    wait_for(lambda: threshold() == "512", "new threshold in the engine args")
    assert cluster.statefulset().metadata.uid == sts_uid

    # Turning the policies off removes them.
    cluster.patch_spec({"networkPolicy": {"enabled": False}})
    wait_for(lambda: not any(kube_api.find(NETPOL, NS, f"smollm2-{r}") for r in ("prefill", "decode", "gateway")),
             "NetworkPolicies pruned")

    reasons = {reason for reason, _ in cluster.events()}
    assert {"Created", "GroupAssigned", "Updated", "Phase"} <= reasons, reasons

    # Deleting the cluster removes what it owns (and the operator lets it go).
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "smollm2")

    def gone() -> bool:
        try:
            cluster.get()
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, "the LAPSCluster to be deleted")
    wait_for(lambda: not cluster.services(), "services deleted")
    wait_for(lambda: not cluster.apps.list_namespaced_stateful_set(NS).items, "StatefulSet deleted")
    wait_for(lambda: not cluster.pod_groups(), "prefill pods garbage-collected")


def test_restarted_operator_creates_no_duplicates_and_changes_no_labels(kube_api, start_operator):
    first = start_operator()
    cluster = Cluster(kube_api, "steady")
    cluster.create(example("steady"))
    wait_for(cluster.statefulset, "the prefill StatefulSet")
    cluster.act_as_statefulset_controller()
    wait_for(lambda: sorted(cluster.pod_groups().values()) == ["long", "long", "short", "short"], "groups")
    cluster.report_ready()
    wait_for(lambda: cluster.status().get("phase") == "Ready", "phase Ready")
    first.stop()

    children = [("apps/v1/statefulsets", "steady-prefill"), ("apps/v1/deployments", "steady-decode"),
                ("apps/v1/deployments", "steady-gateway"), ("v1/configmaps", "steady-config"),
                ("v1/serviceaccounts", "steady-gateway"), ("rbac.authorization.k8s.io/v1/roles", "steady-gateway"),
                ("rbac.authorization.k8s.io/v1/rolebindings", "steady-gateway"),
                *(("v1/services", f"steady-{s}") for s in ("prefill", "prefill-short", "prefill-long", "decode",
                                                          "gateway")),
                *(("v1/pods", f"steady-prefill-{i}") for i in range(4))]

    def snapshot() -> dict[str, tuple[str, str, dict]]:
        found = {f"{r}/{n}": kube_api.find(r, NS, n) for r, n in children}
        assert all(found.values()), [k for k, v in found.items() if not v]
        return {k: (o["metadata"]["uid"], o["metadata"]["resourceVersion"], o["metadata"].get("labels"))
                for k, o in found.items()}

    before = snapshot()
    second = start_operator()
    wait_for(lambda: (second.metric("laps_operator_reconciles_total", result="ok") or 0) >= 1, "the resume handler")
    wait_for(lambda: second.metric("laps_operator_group_size", cluster="default/steady", group="short") == 2,
             "group sizes exported")
    # Every write bumps an object's resourceVersion: equal versions mean nothing was created,
    # patched or relabelled.
    assert snapshot() == before
    assert len(cluster.apps.list_namespaced_stateful_set(NS).items) == 1


def test_invalid_cluster_gets_a_condition_and_no_children(kube_api, start_operator):
    start_operator()
    cluster = Cluster(kube_api, "broken")
    # Valid field by field, so only the cross-field rule (a CEL rule on a real server) catches it.
    cluster.create(example("broken", prefill={"replicas": 2, "tensorParallelSize": 2}))
    invalid = wait_for(lambda: cluster.condition("InvalidSpec"), "the InvalidSpec condition")
    assert invalid["status"] == "True"
    assert "tensorParallelSize > 1 needs engine.backend sglang" in invalid["message"]
    assert cluster.status()["phase"] == "Invalid"
    assert cluster.condition("Ready")["status"] == "False"
    assert ("InvalidSpec", invalid["message"]) in cluster.events() or wait_for(
        lambda: any(r == "InvalidSpec" for r, _ in cluster.events()), "an InvalidSpec event")
    assert not cluster.apps.list_namespaced_stateful_set(NS).items
    assert not cluster.apps.list_namespaced_deployment(NS).items
    assert not cluster.services()

    # Fixing the spec lets the reconcile proceed.
    cluster.patch_spec({"engine": {"backend": "sglang"}})
    wait_for(cluster.statefulset, "the prefill StatefulSet after the fix")
    wait_for(lambda: cluster.condition("InvalidSpec")["status"] == "False", "InvalidSpec cleared")


# The part of the Prometheus Operator's PodMonitor CRD the API server needs to serve the kind.
PODMONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def test_drift_is_repaired_and_the_pod_monitor_follows_the_spec(kube_api, start_operator, tmp_path):
    crd_file = tmp_path / "podmonitor-crd.yaml"
    crd_file.write_text(yaml.safe_dump(PODMONITOR_CRD))
    kube_api.apply_crd(crd_file)  # as installing the Prometheus Operator would
    start_operator(LAPS_OPERATOR_RESYNC_SECONDS="1")
    cluster = Cluster(kube_api, "drift")
    body = example("drift")
    body["spec"]["monitoring"]["podMonitor"] = True
    cluster.create(body)

    def pod_monitor():
        return cluster.custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", NS, "podmonitors", "drift")

    monitor = wait_for(pod_monitor, "the PodMonitor")
    assert monitor["spec"]["selector"] == {"matchLabels": {"laps.io/cluster": "drift"}}

    # A child deleted by hand comes back on the next resync.
    original = wait_for(lambda: cluster.core.read_namespaced_service("drift-decode", NS), "the decode Service")
    cluster.core.delete_namespaced_service("drift-decode", NS)
    restored = wait_for(lambda: cluster.core.read_namespaced_service("drift-decode", NS), "the Service restored")
    assert restored.metadata.uid != original.metadata.uid
    assert restored.spec.selector == original.spec.selector
    wait_for(lambda: any(reason == "Repaired" for reason, _ in cluster.events()), "a Repaired event")

    # Turning the PodMonitor off removes it.
    cluster.patch_spec({"monitoring": {"podMonitor": False}})

    def monitor_gone() -> bool:
        try:
            pod_monitor()
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(monitor_gone, "the PodMonitor removed")
