"""Every manifest the operator renders for the examples is valid Kubernetes 1.37, and its pods
keep the settings the restricted Pod Security level and the image need. That the real admission
plugin admits them, and refuses a pod breaking any control, is tests/cluster/test_pod_security.py's."""
from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from laps_operator.naming import ClusterRef
from laps_operator.render.builders import build_children
from laps_operator.render.pod_security import RUN_AS_ID
from laps_operator.spec.cluster import parse_spec
from tests.unit.operator.crd_jsonschema import EXAMPLES, REPO, apply_defaults, load_crd, openapi_schema

SCHEMA = openapi_schema(load_crd())
KUBE_VERSION = "1.37"


def rendered(path) -> list[dict]:
    doc = apply_defaults(yaml.safe_load(path.read_text()), SCHEMA)
    return build_children(ClusterRef(doc["metadata"]["name"], "serving", "uid-1"), parse_spec(doc["spec"]))


def pod_spec(children: list[dict], role: str) -> dict:
    (workload,) = [c for c in children if c["kind"] in ("StatefulSet", "Deployment")
                   and c["metadata"]["labels"].get("laps.io/role") == role]
    return workload["spec"]["template"]["spec"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_manifest_of_every_example_is_valid_kubernetes(path):
    children = rendered(path)
    assert {"NetworkPolicy"} <= {c["kind"] for c in children}
    for child in children:
        if child["kind"] == "PodMonitor":  # Prometheus Operator's CRD: no schema shipped
            continue
        kubernetes_validate.validate(child, KUBE_VERSION, strict=True)


def test_pods_run_as_the_images_user_with_a_writable_tmp():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"USER {RUN_AS_ID}:{RUN_AS_ID}" in dockerfile
    children = rendered(REPO / "examples" / "lapscluster-minimal.yaml")
    for role in ("prefill", "decode", "gateway"):
        spec = pod_spec(children, role)
        assert spec["securityContext"]["runAsUser"] == RUN_AS_ID
        (container,) = spec["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert tmp and any(v["name"] == tmp[0]["name"] and "emptyDir" in v for v in spec["volumes"])
        assert {"name": "HOME", "value": "/tmp"} in container["env"]


def test_gpu_engines_stay_restricted_and_keep_their_gpus():
    children = rendered(REPO / "examples" / "lapscluster-gpu.yaml")
    for role in ("prefill", "decode"):
        spec = pod_spec(children, role)
        (container,) = spec["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
        # SGLang compiles kernels at run time: its root filesystem stays writable (not a PSS control).
        assert container["securityContext"]["readOnlyRootFilesystem"] is False


def test_a_users_own_home_is_kept():
    spec = parse_spec({"model": {"name": "m", "path": "/m"}, "engine": {"env": [{"name": "HOME", "value": "/data"}]}})
    children = build_children(ClusterRef("c", "ns", "u"), spec)
    (container,) = pod_spec(children, "decode")["containers"]
    assert [e for e in container["env"] if e["name"] == "HOME"] == [{"name": "HOME", "value": "/data"}]
