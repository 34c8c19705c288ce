"""The Helm chart, rendered by Helm's own Go SDK (helm-python-sdk): what `helm install laps
charts/laps` would send, validated against Kubernetes 1.37's schemas."""
from __future__ import annotations

import pathlib
import re

import helm_python
import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "laps"
KUBE_VERSION = "1.37"
# Kinds from other projects' CRDs that kubernetes-validate has no schema for.
FOREIGN_KINDS = {"ServiceMonitor"}


def render(values: dict | None = None, namespace: str = "laps-system", release: str = "laps") -> list[dict]:
    chart = helm_python.Chart.load(CHART)
    out = chart.render(values or {}, name=release, namespace=namespace, is_install=True)
    docs = []
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"watchNamespaces": ["team-a", "team-b"]},
        {"metrics": {"serviceMonitor": {"enabled": True}}, "grafana": {"dashboards": {"enabled": False}}},
    ],
    ids=["defaults", "namespaced", "servicemonitor-no-dashboards"],
)
def test_every_rendered_manifest_is_valid_kubernetes(values):
    docs = render(values)
    assert docs
    for doc in docs:
        if doc["kind"] in FOREIGN_KINDS:
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_helm_lint_strict_finds_no_warnings_or_errors():
    report = helm_python.lint(str(CHART), {}, strict=True, kube_version=f"v{KUBE_VERSION}.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_default_install_watches_all_namespaces_with_cluster_rbac():
    docs = render()
    (deploy,) = by_kind(docs, "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator" and "--all-namespaces" in args
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    (role,) = [r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"] == binding["roleRef"]["name"]]
    # Which rules, and why each: the least-privilege e2e test derives them from what the
    # operator does (tests/cluster/test_least_privilege.py). Both modes grant the same
    # rules: the operator needs nothing cluster-scoped (kopf's namespace/CRD scanning is off).
    (namespaced,) = by_kind(render({"watchNamespaces": ["team-a"]}), "Role")
    assert role["rules"] == namespaced["rules"]
    (sa,) = by_kind(docs, "ServiceAccount")
    assert binding["subjects"][0]["name"] == sa["metadata"]["name"]
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_watch_namespaces_gives_namespaced_roles_only():
    docs = render({"watchNamespaces": ["team-a", "team-b"]})
    # The only ClusterRoles are the ones aggregated into the built-in view/edit/admin roles
    # (test_chart_values.py); the operator is bound to none.
    assert not by_kind(docs, "ClusterRoleBinding")
    assert all(any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in r["metadata"]["labels"])
               for r in by_kind(docs, "ClusterRole"))
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == ["team-a", "team-b"]
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--all-namespaces" not in args


def test_dashboards_ship_as_labelled_configmaps_with_valid_json():
    import json

    cms = [d for d in by_kind(render(), "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert cms, "no dashboard ConfigMap"
    for cm in cms:
        for text in cm["data"].values():
            assert json.loads(text)["panels"]


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"replicas": 2}, "/replicas"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        # A digest alone as the tag would render repository:sha256:…, which the kubelet only
        # refuses at pull time (InvalidImageName).
        ({"image": {"repository": "x", "pullPolicy": "Always", "tag": "sha256:" + "a" * 64}}, "/image/tag"),
        ({"image": {"repository": "x", "pullPolicy": "Always", "digest": "sha256:abc"}}, "/image/digest"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
        ({"metrics": {"port": 8081}}, "/metrics/port"),
        ({"unknownKey": 1}, "unknownKey"),
        # The API server would only warn and drop the misspelt key: the operator would run
        # without the limit its installer asked for.
        ({"resources": {"limts": {"memory": "1Gi"}}}, "/resources"),
        ({"resources": {"limits": {"memory": ["1Gi"]}}}, "/resources/limits/memory"),
    ],
)
def test_bad_values_are_rejected_with_the_offending_path(values, fragment):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert fragment in str(err.value)


def test_operator_pods_carry_the_labels_the_gateway_network_policy_admits():
    from laps_operator.naming import OPERATOR_POD_LABELS

    (deploy,) = by_kind(render(), "Deployment")
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert OPERATOR_POD_LABELS.items() <= labels.items()


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@pytest.mark.parametrize("release", ["laps", "r" * 53, "team-a-serving-stack-" + "x" * 32])
def test_every_name_is_one_the_api_server_accepts_up_to_helms_longest_release_name(release):
    # Helm allows release names of up to 53 characters; names the server would refuse are not
    # something kubernetes-validate checks.
    values = {"metrics": {"serviceMonitor": {"enabled": True}}, "watchNamespaces": ["team-a"]}
    for docs in (render(release=release), render(values, release=release)):
        for doc in docs:
            name = doc["metadata"]["name"]
            assert DNS_1123_SUBDOMAIN.match(name) and len(name) <= 253, name
            if doc["kind"] == "Service":
                assert DNS_1035.match(name) and len(name) <= 63, f"Service {name!r} ({len(name)})"
            assert all(len(v) <= 63 for v in doc["metadata"]["labels"].values()), doc["metadata"]["labels"]
        (service,) = by_kind(docs, "Service")
        (deploy,) = by_kind(docs, "Deployment")
        selector = service["spec"]["selector"]
        assert selector.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()


def test_non_default_values_reach_the_operator_pod_and_its_bindings():
    values = {
        "image": {"repository": "registry.example/laps-operator", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "resources": {"requests": {"cpu": "1"}},
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "serviceAccount": {"create": True, "name": "laps-operator-sa"},
        "grafana": {"dashboards": {"enabled": False}},
        "metrics": {"port": 9090},
        "watchNamespaces": ["team-a", "team-b"],
    }
    docs = render(values, namespace="ops")
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert (ctr["image"], ctr["imagePullPolicy"]) == ("registry.example/laps-operator:1.2.3", "Always")
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert (pod["nodeSelector"], pod["tolerations"]) == (values["nodeSelector"], values["tolerations"])
    assert ctr["resources"]["requests"]["cpu"] == "1"   # merged into the default requests
    assert "--metrics-port=9090" in ctr["args"] and {"name": "metrics", "containerPort": 9090,
                                                       "protocol": "TCP"} in ctr["ports"]
    assert not by_kind(docs, "ConfigMap")
    (sa,) = by_kind(docs, "ServiceAccount")
    assert (sa["metadata"]["name"], sa["metadata"]["namespace"]) == ("laps-operator-sa", "ops")
    assert pod["serviceAccountName"] == "laps-operator-sa"
    for binding in by_kind(docs, "RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "laps-operator-sa", "namespace": "ops"}]
    assert all(d["metadata"].get("namespace") == "ops" for d in docs
               if d["kind"] not in ("Role", "RoleBinding", "ClusterRole"))


def test_an_image_digest_pins_the_operator_image():
    digest = "sha256:" + "0123456789abcdef" * 4
    (deploy,) = by_kind(render({"image": {"repository": "registry.example/laps-operator", "tag": "1.2.3",
                                          "digest": digest, "pullPolicy": "IfNotPresent"}}), "Deployment")
    (ctr,) = deploy["spec"]["template"]["spec"]["containers"]
    assert ctr["image"] == f"registry.example/laps-operator@{digest}"
