"""Every pod the operator builds for the examples is admitted by a namespace enforcing the
restricted Pod Security Standard, and every manifest it renders is valid Kubernetes 1.37."""
from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml

from laps_operator.naming import ClusterRef
from laps_operator.render.builders import build_children
from laps_operator.render.pod_security import RUN_AS_ID
from laps_operator.spec.cluster import parse_spec
from tests.support.pod_security_standard import violations
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
def test_every_pod_of_every_example_meets_the_restricted_standard(path):
    children = rendered(path)
    workloads = [c for c in children if c["kind"] in ("StatefulSet", "Deployment")]
    assert len(workloads) == 3
    for child in children:
        assert violations(child) == [], child["metadata"]["name"]


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
    assert [v for c in children for v in violations(c)] == []


def test_a_users_own_home_is_kept():
    spec = parse_spec({"model": {"name": "m", "path": "/m"}, "engine": {"env": [{"name": "HOME", "value": "/data"}]}})
    children = build_children(ClusterRef("c", "ns", "u"), spec)
    (container,) = pod_spec(children, "decode")["containers"]
    assert [e for e in container["env"] if e["name"] == "HOME"] == [{"name": "HOME", "value": "/data"}]


def _broken(change) -> list[str]:
    children = rendered(REPO / "examples" / "lapscluster-minimal.yaml")
    workload = copy.deepcopy(next(c for c in children if c["kind"] == "Deployment"))
    change(workload["spec"]["template"]["spec"])
    return violations(workload)


def _container(spec):
    return spec["containers"][0]


@pytest.mark.parametrize("change, fragment", [
    (lambda s: s.update(hostNetwork=True), "hostNetwork"),
    (lambda s: s.update(hostPID=True), "hostPID"),
    (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
    (lambda s: s["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}}), "not allowed"),
    (lambda s: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]), "safe set"),
    (lambda s: _container(s)["securityContext"].update(privileged=True), "privileged"),
    (lambda s: _container(s)["securityContext"].update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation"),
    (lambda s: _container(s)["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "exceed baseline"),
    (lambda s: _container(s)["securityContext"]["capabilities"].update(add=["CHOWN"]), "only NET_BIND_SERVICE"),
    (lambda s: _container(s)["securityContext"]["capabilities"].update(drop=["NET_RAW"]), "drop must include ALL"),
    (lambda s: _container(s)["securityContext"].update(runAsNonRoot=False), "runAsNonRoot"),
    (lambda s: _container(s)["securityContext"].update(runAsUser=0), "runAsUser"),
    (lambda s: _container(s)["securityContext"].update(seccompProfile={"type": "Unconfined"}), "seccompProfile"),
    (lambda s: _container(s)["securityContext"].update(procMount="Unmasked"), "procMount"),
    (lambda s: _container(s)["securityContext"].update(seLinuxOptions={"type": "spc_t"}), "seLinuxOptions"),
    (lambda s: _container(s)["securityContext"].update(appArmorProfile={"type": "Unconfined"}), "appArmor"),
    (lambda s: _container(s)["ports"][0].update(hostPort=80), "hostPort"),
    (lambda s: _container(s)["readinessProbe"]["httpGet"].update(host="10.0.0.1"), "host must be unset"),
])
def test_the_checker_catches_each_control(change, fragment):
    found = _broken(change)
    assert any(fragment in v for v in found), found


def test_the_checker_accepts_the_add_back_the_standard_allows():
    assert _broken(lambda s: _container(s)["securityContext"]["capabilities"].update(add=["NET_BIND_SERVICE"])) == []
