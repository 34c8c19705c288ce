"""Helm 4 (its Go SDK through helm-python-sdk) installs, upgrades and uninstalls a chart against
the emulator, as it would against a cluster (server-side apply, OpenAPI probing, CRDs)."""
from __future__ import annotations

from pathlib import Path

import kubernetes
import pytest
import yaml
from kubernetes.client import ApiException

from tests.integration.kube_emulator.crd_samples import GROUP, PLURAL, VERSION, widget_crd

helm_python = pytest.importorskip("helm_python")

TEMPLATE = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-settings
  labels: {app.kubernetes.io/managed-by: Helm}
data:
  size: {{ .Values.size | quote }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
spec:
  replicas: {{ .Values.replicas }}
  selector: {matchLabels: {app: demo}}
  template:
    metadata: {labels: {app: demo}}
    spec:
      containers: [{name: demo, image: "demo:1"}]
"""


def _write_chart(root: Path) -> Path:
    chart = root / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "crds").mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\nkubeVersion: '>=1.30.0-0'\n")
    (chart / "values.yaml").write_text("size: 1\nreplicas: 1\n")
    (chart / "templates" / "demo.yaml").write_text(TEMPLATE)
    (chart / "crds" / "widgets.yaml").write_text(yaml.safe_dump(widget_crd()))
    return chart


def test_helm_install_upgrade_uninstall(kube_api, tmp_path):
    chart = _write_chart(tmp_path)
    core = kubernetes.client.CoreV1Api(kube_api.api_client())
    apps = kubernetes.client.AppsV1Api(kube_api.api_client())
    helm = helm_python.Config(kubeconfig_path=str(kube_api.kubeconfig), storage_driver="memory",
                              namespace="demo-ns")
    try:
        release = helm.install(str(chart), "rel", {"size": 3}, namespace="demo-ns", create_namespace=True)
        assert release["status"] == "deployed"
        assert core.read_namespaced_config_map("rel-settings", "demo-ns").data == {"size": "3"}
        assert "demo-ns" in {n.metadata.name for n in core.list_namespace().items}
        kubernetes.client.CustomObjectsApi(kube_api.api_client()).list_namespaced_custom_object(
            GROUP, VERSION, "demo-ns", PLURAL)  # the chart's CRD is served

        helm.upgrade(str(chart), "rel", {"size": 3, "replicas": 2}, namespace="demo-ns")
        assert apps.read_namespaced_deployment("rel", "demo-ns").spec.replicas == 2

        helm.uninstall("rel")
        with pytest.raises(ApiException) as err:
            core.read_namespaced_config_map("rel-settings", "demo-ns")
        assert err.value.status == 404
    finally:
        helm.close()
