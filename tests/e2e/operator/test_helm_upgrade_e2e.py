"""Day 2 with Helm against the emulated API server: `helm upgrade` from an older chart whose CRD
lacked fields, the procedure docs/kubernetes.md gives (`kubectl apply --server-side` of the chart's CRD,
then the upgrade), and `helm uninstall`, which leaves the CRD and the LAPSClusters in place.

Helm creates a chart's crds/ only when the CRD is absent: without the chart's check, the upgrade
would succeed over the old schema and the API server would drop the new fields from every
LAPSCluster, silently."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import helm_python
import kubernetes
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "laps"
CRD_FILE = CHART / "crds" / "lapscluster.yaml"
NS = "laps-system"
NEW_FIELD = "imagePullSecrets"   # a spec field the chart's CRD has and the older one lacks


def _older_chart(root: pathlib.Path) -> pathlib.Path:
    """This chart as an earlier version shipped it: its CRD one field short and unannotated, and
    no CRD check (what a user upgrading today has installed)."""
    old = root / "laps"
    shutil.copytree(CHART, old)
    (old / "templates" / "crd-check.yaml").unlink()
    (old / "values.yaml").write_text((old / "values.yaml").read_text().replace("checkCRD: true", ""))
    crd = yaml.safe_load(CRD_FILE.read_text())
    del crd["metadata"]["annotations"]
    spec_props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    del spec_props[NEW_FIELD]
    (old / "crds" / "lapscluster.yaml").write_text(yaml.safe_dump(crd))
    chart = yaml.safe_load((old / "Chart.yaml").read_text())
    (old / "Chart.yaml").write_text(yaml.safe_dump({**chart, "version": "0.0.1"}))
    return old


def _apply_crd_server_side(kube_api, ext: kubernetes.client.ApiextensionsV1Api) -> None:
    """`kubectl apply --server-side --force-conflicts -f` of the chart's CRD, as docs/kubernetes.md says;
    where kubectl is missing, the same server-side apply through the client."""
    if shutil.which("kubectl"):
        subprocess.run(["kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE)],
                       check=True, capture_output=True, env={**os.environ, "KUBECONFIG": str(kube_api.kubeconfig)})
        return
    crd = yaml.safe_load(CRD_FILE.read_text())
    ext.patch_custom_resource_definition(crd["metadata"]["name"], crd, field_manager="kubectl", force=True,
                                         _content_type="application/apply-patch+yaml")


def _spec_fields(ext: kubernetes.client.ApiextensionsV1Api) -> set[str]:
    crd = ext.read_custom_resource_definition(yaml.safe_load(CRD_FILE.read_text())["metadata"]["name"])
    return set(crd.spec.versions[0].schema.open_apiv3_schema.properties["spec"].properties)


def test_upgrade_over_an_older_crd_stops_until_the_charts_crd_is_applied(kube_api, tmp_path):
    api = kube_api.api_client()
    ext, apps = kubernetes.client.ApiextensionsV1Api(api), kubernetes.client.AppsV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    helm = helm_python.Config(kubeconfig_path=str(kube_api.kubeconfig), storage_driver="memory", namespace=NS)
    try:
        helm.install(str(_older_chart(tmp_path)), "laps", {}, namespace=NS, create_namespace=True)
        assert NEW_FIELD not in _spec_fields(ext)
        before = apps.read_namespaced_deployment("laps", NS).spec.template.spec.containers[0].args

        with pytest.raises(helm_python.HelmError) as err:
            helm.upgrade(str(CHART), "laps", {"logLevel": "debug"}, namespace=NS)
        # --reuse-values keeps the older release's values, which lack checkCRD: still refused.
        with pytest.raises(helm_python.HelmError):
            helm.upgrade(str(CHART), "laps", {}, namespace=NS, reuse_values=True)
        # The message says what to run; nothing of the release changed.
        assert "kubectl apply --server-side --force-conflicts -f charts/laps/crds/lapscluster.yaml" in str(err.value)
        assert apps.read_namespaced_deployment("laps", NS).spec.template.spec.containers[0].args == before

        # docs/kubernetes.md's procedure: the chart's CRD first, then upgrade.
        _apply_crd_server_side(kube_api, ext)
        assert NEW_FIELD in _spec_fields(ext)
        assert helm.upgrade(str(CHART), "laps", {"logLevel": "debug"}, namespace=NS)["status"] == "deployed"
        args = apps.read_namespaced_deployment("laps", NS).spec.template.spec.containers[0].args
        assert "--log-level=debug" in args

        # Uninstall removes the operator, never the CRD (Helm leaves crds/ alone) nor the clusters.
        example = yaml.safe_load((REPO / "examples" / "lapscluster-minimal.yaml").read_text())
        custom.create_namespaced_custom_object("laps.io", "v1alpha1", "default", "lapsclusters", example)
        helm.uninstall("laps")
        assert not apps.list_namespaced_deployment(NS).items
        assert NEW_FIELD in _spec_fields(ext)
        assert custom.list_namespaced_custom_object("laps.io", "v1alpha1", "default", "lapsclusters")["items"]
    finally:
        helm.close()


def test_check_crd_false_lets_an_installer_that_keeps_the_crd_itself_upgrade(kube_api, tmp_path):
    # For those who may not read CustomResourceDefinitions (lookup fails: forbidden) or apply the
    # CRD through their own pipeline.
    helm = helm_python.Config(kubeconfig_path=str(kube_api.kubeconfig), storage_driver="memory", namespace=NS)
    try:
        helm.install(str(_older_chart(tmp_path)), "laps", {}, namespace=NS, create_namespace=True)
        with pytest.raises(helm_python.HelmError):
            helm.upgrade(str(CHART), "laps", {}, namespace=NS)
        assert helm.upgrade(str(CHART), "laps", {"checkCRD": False}, namespace=NS)["status"] == "deployed"
    finally:
        helm.close()
