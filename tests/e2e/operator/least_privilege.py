"""The operator story run with least privilege: `helm install` of the chart (as the cluster's
admin), then `laps operator` with the token of the chart's ServiceAccount and `laps gateway`
with the token of the ServiceAccount the operator made for it, both from the TokenRequest API
as the kubelet would mount them. The emulator enforces RBAC (tests/support/kube_emulator_rbac.py)
and keeps every access decision, so a test can name the step a missing permission broke and
list the permissions each program really used.

What the emulator cannot show, and who plays it: no kubelet runs the chart's operator
Deployment or the gateway Deployment (the test starts both processes with those accounts'
tokens); no StatefulSet controller or kubelet (the test creates the prefill pods, Running and
Ready on loopback addresses); the EndpointSlice controller is the emulator's opt-in one. The
admin's own requests (Helm, the test acting as controllers) are not what is being checked.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import helm_python
import httpx
import kubernetes
import yaml

from laps_agent.policy.classes import CLASSES
from tests.e2e.operator.conftest import REPO, wait_for
from tests.support.kube_emulator_access import SHORTCUT
from tests.support.kube_emulator_rbac import Attributes, expand_rules

CHART = REPO / "charts" / "laps"
RELEASE, RELEASE_NS = "laps", "laps-system"
NS, NAME = "default", "smollm2"
GROUP, VERSION, PLURAL = "laps.io", "v1alpha1", "lapsclusters"
MODES: dict[str, dict[str, Any]] = {"all-namespaces": {}, "watched-namespaces": {"watchNamespaces": [NS]}}
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NS}:{RELEASE}"
GATEWAY_SA = f"{NAME}-gateway"
GATEWAY_USER = f"system:serviceaccount:{NS}:{GATEWAY_SA}"
PODMONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}

# One child of every kind the operator makes (URL of its collection, name).
CHILDREN = [(f"/apis/apps/v1/namespaces/{NS}/statefulsets", f"{NAME}-prefill"),
            (f"/apis/apps/v1/namespaces/{NS}/deployments", f"{NAME}-gateway"),
            (f"/api/v1/namespaces/{NS}/services", f"{NAME}-decode"),
            (f"/api/v1/namespaces/{NS}/configmaps", f"{NAME}-config"),
            (f"/api/v1/namespaces/{NS}/serviceaccounts", GATEWAY_SA),
            (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles", GATEWAY_SA),
            (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings", GATEWAY_SA),
            (f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies", f"{NAME}-gateway"),
            (f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors", NAME)]
Triple = tuple[str, str, str]   # (API group, resource[/subresource], verb)


class StepDenied(AssertionError):
    def __init__(self, step: str, user: str, attrs: Attributes) -> None:
        super().__init__(f"step {step!r}: {user} was refused: {attrs.describe()}")
        self.step, self.user, self.attrs = step, user, attrs


def scope_args(mode: str) -> tuple[str, ...]:
    return ("--all-namespaces",) if mode == "all-namespaces" else tuple(f"--namespace={n}" for n in
                                                                          MODES[mode]["watchNamespaces"])


def chart_operator_rules(mode: str) -> list[dict]:
    """The rules the chart grants the operator's ServiceAccount in this mode (rendered offline):
    those of the roles its bindings name (not the ClusterRoles it aggregates into `view`/`edit`)."""
    rendered = helm_python.Chart.load(str(CHART)).render(MODES[mode], name=RELEASE, namespace=RELEASE_NS,
                                                         is_install=True)
    docs = [doc for path, text in rendered.items() if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]
    operator = {"kind": "ServiceAccount", "name": RELEASE, "namespace": RELEASE_NS}
    bound = {(d["roleRef"]["kind"], d["roleRef"]["name"]) for d in docs
             if d["kind"] in ("ClusterRoleBinding", "RoleBinding") and operator in d["subjects"]}
    rules: list[dict] = []
    for doc in docs:
        if (doc["kind"], doc["metadata"]["name"]) in bound:
            rules += doc["rules"]
    return rules


def triples(rules: Iterable[dict]) -> set[Triple]:
    return {(a.group, a.full_resource, a.verb) for a in expand_rules(rules, "")}


@dataclass
class Story:
    kube_api: Any
    start_operator: Callable[..., Any]
    gateway_process: Callable[..., Any]
    monkeypatch: Any
    mode: str = "all-namespaces"
    step: str = "install"
    _seen: int = 0
    steps_done: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        client = self.kube_api.api_client()
        self.core = kubernetes.client.CoreV1Api(client)
        self.apps = kubernetes.client.AppsV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)

    # --- watching for refusals -----------------------------------------------------------------

    def _check_denials(self) -> None:
        entries = self.kube_api.call(lambda: self.kube_api.emulator.access.audit[self._seen:])
        self._seen += len(entries)
        for entry in entries:
            if not entry.allowed and entry.user in (OPERATOR_USER, GATEWAY_USER) and entry.purpose != SHORTCUT:
                raise StepDenied(self.step, entry.user, entry.attrs)

    def wait(self, probe: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        """wait_for(probe), failing at once with StepDenied when either account was refused."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_denials()
            try:
                return wait_for(probe, f"{what} (step {self.step!r})", timeout=min(1.0, timeout))
            except AssertionError:
                if time.monotonic() > deadline:
                    raise

    def used(self, user: str) -> set[Triple]:
        return {(e.attrs.group, e.attrs.full_resource, e.attrs.verb) for e in self.kube_api.audit
                if e.user == user and e.allowed and e.attrs.is_resource}

    # --- the steps -----------------------------------------------------------------------------

    def install(self, edit_rules: Callable[[list[dict]], list[dict]] | None = None) -> None:
        """`helm install` as the admin; `edit_rules` changes the operator's stored role(s)
        afterwards (a chart with a rule removed); then every request must carry credentials."""
        self.step = "install"
        helm = helm_python.Config(kubeconfig_path=str(self.kube_api.kubeconfig), storage_driver="memory",
                                  namespace=RELEASE_NS)
        try:
            helm.install(str(CHART), RELEASE, MODES[self.mode], namespace=RELEASE_NS, create_namespace=True)
        finally:
            helm.close()
        self.kube_api.http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                json=PODMONITOR_CRD).raise_for_status()
        if edit_rules is not None:
            rbac = kubernetes.client.RbacAuthorizationV1Api(self.kube_api.api_client())
            if self.mode == "all-namespaces":
                role = rbac.read_cluster_role(RELEASE)
                rbac.patch_cluster_role(RELEASE, {"rules": edit_rules(_plain_rules(role.rules))})
            else:
                role = rbac.read_namespaced_role(RELEASE, NS)
                rbac.patch_namespaced_role(RELEASE, NS, {"rules": edit_rules(_plain_rules(role.rules))})
        self.kube_api.require_credentials()

    def run(self) -> None:
        for step in (self.start, self.create, self.pods, self.gateway, self.scale_up, self.relabel,
                     self.repair, self.prune, self.delete):
            self.step = step.__name__
            step()
            self._check_denials()
            self.steps_done.append(self.step)

    def start(self) -> None:
        # A 1 s resync, so the repair step need not wait a minute for it.
        try:
            self.start_operator(kubeconfig=self.kube_api.kubeconfig_for(RELEASE_NS, RELEASE),
                                scope=scope_args(self.mode), LAPS_OPERATOR_RESYNC_SECONDS="1")
        except Exception:
            self._check_denials()   # an operator that exited for want of a permission: say which
            raise

    def create(self) -> None:
        body = yaml.safe_load((REPO / "examples" / "lapscluster.yaml").read_text())
        body["spec"]["monitoring"]["podMonitor"] = True
        self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
        self.wait(lambda: self.status().get("phase") in ("Progressing", "Ready"), "a phase in status")
        for kind, plural, name in (("networking.k8s.io/v1", "networkpolicies", f"{NAME}-gateway"),
                                   ("monitoring.coreos.com/v1", "podmonitors", NAME),
                                   ("rbac.authorization.k8s.io/v1", "rolebindings", GATEWAY_SA)):
            self.wait(lambda k=kind, p=plural, n=name: self.kube_api.find(f"{k}/{p}", NS, n), f"{plural}/{name}")

    def status(self) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME).get("status") or {}

    def groups(self) -> dict[str, str | None]:
        pods = self.core.list_namespaced_pod(NS, label_selector=f"laps.io/cluster={NAME},laps.io/role=prefill")
        return {p.metadata.name: (p.metadata.labels or {}).get("laps.io/prefill-group") for p in pods.items}

    def sync_pods(self) -> None:
        """As the StatefulSet controller and kubelet: pods 0..replicas-1, Running and Ready on
        127.0.0.<n> (refused at once when the gateway polls them: no engine runs here)."""
        sts = self.apps.read_namespaced_stateful_set(f"{NAME}-prefill", NS)
        have = set(self.groups())
        want = {f"{NAME}-prefill-{i}" for i in range(sts.spec.replicas)}
        template = self.kube_api.api_client().sanitize_for_serialization(sts.spec.template)
        for name in sorted(want - have):
            ordinal = int(name.rsplit("-", 1)[1])
            self.core.create_namespaced_pod(NS, {"metadata": {
                "name": name, "labels": template["metadata"]["labels"],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "controller": True,
                                     "name": sts.metadata.name, "uid": sts.metadata.uid}]},
                "spec": template["spec"]})
            self.core.patch_namespaced_pod_status(name, NS, {"status": {
                "phase": "Running", "podIP": f"127.0.0.{ordinal + 2}",
                "conditions": [{"type": "Ready", "status": "True"}]}})
        for name in sorted(have - want):
            self.core.delete_namespaced_pod(name, NS)

    def pods(self) -> None:
        self.sync_pods()
        self.wait(lambda: self.groups() == {f"{NAME}-prefill-{i}": g for i, g in
                                            enumerate(("short", "short", "long", "long"))}, "initial groups")

    def gateway(self) -> None:
        self.kube_api.emulate_endpoint_slices()
        self.monkeypatch.setenv("KUBECONFIG", str(self.kube_api.kubeconfig_for(NS, GATEWAY_SA)))
        process = self.gateway_process(
            "--discovery", "kubernetes", "--namespace", NS, "--prefill-short-service", f"{NAME}-prefill-short",
            "--prefill-long-service", f"{NAME}-prefill-long", "--decode-service", f"{NAME}-decode",
            "--host", "127.0.0.1", "--port", "0")
        self.monkeypatch.setenv("KUBECONFIG", str(self.kube_api.kubeconfig))
        url = process.wait_listening()

        def discovered() -> bool:
            groups = httpx.get(url + "/laps_status", timeout=5).json()["groups"]
            return {g: sorted(p["name"] for p in groups[g]["pods"]) for g in CLASSES} == {
                "short": [f"{NAME}-prefill-0", f"{NAME}-prefill-1"], "long": [f"{NAME}-prefill-2", f"{NAME}-prefill-3"]}
        self.wait(discovered, "the gateway to discover the groups through EndpointSlices")

    def scale_up(self) -> None:
        self._patch_spec({"prefill": {"replicas": 6}})
        self.wait(lambda: self.apps.read_namespaced_stateful_set(f"{NAME}-prefill", NS).spec.replicas == 6, "6 replicas")
        self.sync_pods()
        self.wait(lambda: len([g for g in self.groups().values() if g]) == 6, "pods 4 and 5 grouped")

    def relabel(self) -> None:
        """Scale down to 2: the long group would be empty, so the operator moves pod 1 to it."""
        self._patch_spec({"prefill": {"replicas": 2}})
        self.wait(lambda: self.apps.read_namespaced_stateful_set(f"{NAME}-prefill", NS).spec.replicas == 2, "2 replicas")
        self.sync_pods()
        self.wait(lambda: self.groups() == {f"{NAME}-prefill-0": "short", f"{NAME}-prefill-1": "long"},
                  "pod 1 relabelled long")

    def repair(self) -> None:
        """Someone edits every kind of child by hand; the resync patches each one back."""
        label = "app.kubernetes.io/managed-by"
        edited = [(path, name) for path, name in CHILDREN]
        for path, name in edited:
            self.kube_api.http.patch(f"{path}/{name}", json={"metadata": {"labels": {label: "someone"}}},
                                     headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()

        def restored() -> bool:
            return all(self.kube_api.http.get(f"{path}/{name}").json()["metadata"]["labels"].get(label)
                       == "laps-operator" for path, name in edited)
        self.wait(restored, "every child's label restored")

    def prune(self) -> None:
        self._patch_spec({"networkPolicy": {"enabled": False}, "monitoring": {"podMonitor": False}})
        self.wait(lambda: not self.kube_api.find("networking.k8s.io/v1/networkpolicies", NS, f"{NAME}-gateway")
                  and not self.kube_api.find("monitoring.coreos.com/v1/podmonitors", NS, NAME),
                  "NetworkPolicies and the PodMonitor removed")

    def delete(self) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME)
        self.wait(lambda: not self.custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"],
                  "the LAPSCluster gone")
        self.wait(lambda: not self.apps.list_namespaced_stateful_set(NS).items, "the StatefulSet gone")

    def _patch_spec(self, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, NAME, {"spec": spec},
                                                   _content_type="application/merge-patch+json")


def _plain_rules(rules: Any) -> list[dict]:
    out = []
    for rule in rules or ():
        doc = {"apiGroups": rule.api_groups, "resources": rule.resources, "verbs": rule.verbs}
        if rule.resource_names:
            doc["resourceNames"] = rule.resource_names
        out.append(doc)
    return out


def rule_label(rule: dict) -> str:
    return json.dumps({k: rule[k] for k in ("apiGroups", "resources", "verbs")}, separators=(",", ":"))

