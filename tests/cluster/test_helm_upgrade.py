"""Day 2 with Helm on the real API server: `helm upgrade` from an older chart whose CRD lacked a
field, the procedure docs/kubernetes.md gives (`kubectl apply --server-side` of the chart's CRD,
then the upgrade), and `helm uninstall`, which leaves the CRD and the LAPSClusters in place.

Helm creates a chart's crds/ only when the CRD is absent: without the chart's check, the upgrade
would succeed over the old schema and the API server would prune the new field from every
LAPSCluster, silently (shown here too)."""
from __future__ import annotations

import json
import pathlib
import shutil

import helm_python
import pytest
import yaml

from laps_operator.naming import CRD_NAME
from tests.cluster.story import CHART, RELEASE, RELEASE_NS, REPO

CRD_FILE = CHART / "crds" / "lapscluster.yaml"
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
    del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][NEW_FIELD]
    (old / "crds" / "lapscluster.yaml").write_text(yaml.safe_dump(crd))
    chart = yaml.safe_load((old / "Chart.yaml").read_text())
    (old / "Chart.yaml").write_text(yaml.safe_dump({**chart, "version": "0.0.1"}))
    return old


@pytest.fixture
def helm(control_plane, tmp_path):
    """Helm against a cluster without the CRD (earlier tests' is deleted, with their clusters)."""
    control_plane.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--timeout=60s")
    config = helm_python.Config(kubeconfig_path=str(control_plane.kubeconfig), namespace=RELEASE_NS)
    try:
        yield config
    finally:
        try:
            config.uninstall(RELEASE)
        except helm_python.HelmError:
            pass   # the test uninstalled it
        config.close()
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))


def _spec_fields(control_plane) -> set[str]:
    crd = control_plane.kubectl_json("get", "crd", CRD_NAME)
    return set(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def _operator_args(control_plane) -> list[str]:
    deployment = control_plane.kubectl_json("get", "deployment", RELEASE, "-n", RELEASE_NS)
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_upgrade_over_an_older_crd_stops_until_the_charts_crd_is_applied(control_plane, cluster_namespace, helm,
                                                                         tmp_path):
    helm.install(str(_older_chart(tmp_path)), RELEASE, {}, namespace=RELEASE_NS, create_namespace=True)
    assert NEW_FIELD not in _spec_fields(control_plane)
    # What the check prevents: over the older schema the API server prunes the new field.
    example = yaml.safe_load((REPO / "examples" / "lapscluster-minimal.yaml").read_text())
    example["spec"][NEW_FIELD] = [{"name": "registry"}]
    control_plane.kubectl("apply", "-n", cluster_namespace, "--validate=false", "-f", "-", stdin=json.dumps(example))
    stored = control_plane.kubectl_json("get", "laps", example["metadata"]["name"], "-n", cluster_namespace)
    assert NEW_FIELD not in stored["spec"]
    before = _operator_args(control_plane)

    with pytest.raises(helm_python.HelmError) as err:
        helm.upgrade(str(CHART), RELEASE, {"logLevel": "debug"}, namespace=RELEASE_NS)
    # --reuse-values keeps the older release's values, which lack checkCRD: still refused.
    with pytest.raises(helm_python.HelmError):
        helm.upgrade(str(CHART), RELEASE, {}, namespace=RELEASE_NS, reuse_values=True)
    # The message says what to run; nothing of the release changed.
    assert "kubectl apply --server-side --force-conflicts -f charts/laps/crds/lapscluster.yaml" in str(err.value)
    assert _operator_args(control_plane) == before

    # docs/kubernetes.md's procedure: the chart's CRD first, then upgrade.
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    assert NEW_FIELD in _spec_fields(control_plane)
    assert helm.upgrade(str(CHART), RELEASE, {"logLevel": "debug"}, namespace=RELEASE_NS)["status"] == "deployed"
    assert "--log-level=debug" in _operator_args(control_plane)

    # Uninstall removes the operator, never the CRD (Helm leaves crds/ alone) nor the clusters.
    helm.uninstall(RELEASE)
    assert not control_plane.kubectl_json("get", "deployments", "-n", RELEASE_NS)["items"]
    assert NEW_FIELD in _spec_fields(control_plane)
    assert control_plane.kubectl_json("get", "laps", "-n", cluster_namespace)["items"]


def test_check_crd_false_lets_an_installer_that_keeps_the_crd_itself_upgrade(control_plane, helm, tmp_path):
    # For those who may not read CustomResourceDefinitions (lookup fails: forbidden) or apply the
    # CRD through their own pipeline.
    helm.install(str(_older_chart(tmp_path)), RELEASE, {}, namespace=RELEASE_NS, create_namespace=True)
    with pytest.raises(helm_python.HelmError):
        helm.upgrade(str(CHART), RELEASE, {}, namespace=RELEASE_NS)
    assert helm.upgrade(str(CHART), RELEASE, {"checkCRD": False}, namespace=RELEASE_NS)["status"] == "deployed"
