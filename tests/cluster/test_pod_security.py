"""Pod Security, by the real admission plugin: every pod the operator builds for the examples is
admitted by a namespace enforcing the `restricted` level (server-side dry run, as the StatefulSet
and ReplicaSet controllers would create them), and a pod breaking any one control of the level is
refused with the plugin's own message. (The user story, story.py, runs its pods in such a
namespace too.)"""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from laps_operator.naming import ClusterRef
from laps_operator.render.builders import build_children
from laps_operator.spec.cluster import parse_spec
from tests.unit.operator.crd_jsonschema import EXAMPLES, REPO, apply_defaults, load_crd, openapi_schema

SCHEMA = openapi_schema(load_crd())


def pods_of(path, namespace: str) -> list[dict]:
    """The pods the controllers would create from the example's workloads."""
    doc = apply_defaults(yaml.safe_load(path.read_text()), SCHEMA)
    children = build_children(ClusterRef(doc["metadata"]["name"], namespace, "uid-1"), parse_spec(doc["spec"]))
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"{c['metadata']['name']}-0", "labels": c["spec"]["template"]["metadata"]["labels"]},
             "spec": copy.deepcopy(c["spec"]["template"]["spec"])}
            for c in children if c["kind"] in ("StatefulSet", "Deployment")]


def create(control_plane, namespace: str, pod: dict):
    account = pod["spec"].get("serviceAccountName")
    if account:   # the operator makes the gateway's; the ServiceAccount admission plugin needs it
        control_plane.kubectl("create", "serviceaccount", account, "-n", namespace, check=False)
    return control_plane.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                                 stdin=json.dumps(pod), check=False)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_pod_of_every_example_is_admitted_at_the_restricted_level(control_plane, cluster_namespace, path):
    pods = pods_of(path, cluster_namespace)
    assert len(pods) == 3
    for pod in pods:
        result = create(control_plane, cluster_namespace, pod)
        assert result.returncode == 0, f"{pod['metadata']['name']}: {result.stderr}"
        assert "PodSecurity" not in result.stderr, result.stderr   # not even a warning


def _container(spec):
    return spec["containers"][0]


BROKEN = [
    (lambda s: s.update(hostNetwork=True), "hostNetwork"),
    (lambda s: s.update(hostPID=True), "hostPID"),
    (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
    (lambda s: s["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}}), "restricted volume types"),
    (lambda s: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]), "forbidden sysctls"),
    (lambda s: _container(s)["securityContext"].update(privileged=True, allowPrivilegeEscalation=True), "privileged"),
    (lambda s: _container(s)["securityContext"].update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation"),
    (lambda s: _container(s)["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "capabilities"),
    (lambda s: _container(s)["securityContext"]["capabilities"].update(add=["CHOWN"]), "capabilities"),
    (lambda s: _container(s)["securityContext"]["capabilities"].update(drop=["NET_RAW"]), "capabilities"),
    (lambda s: _container(s)["securityContext"].update(runAsNonRoot=False), "runAsNonRoot"),
    (lambda s: _container(s)["securityContext"].update(runAsUser=0), "runAsUser=0"),
    (lambda s: _container(s)["securityContext"].update(seccompProfile={"type": "Unconfined"}), "seccompProfile"),
    (lambda s: _container(s)["securityContext"].update(seLinuxOptions={"type": "spc_t"}), "seLinuxOptions"),
    (lambda s: _container(s)["securityContext"].update(appArmorProfile={"type": "Unconfined"}), "AppArmor"),
    (lambda s: _container(s)["ports"][0].update(hostPort=80), "hostPort"),
    (lambda s: _container(s)["readinessProbe"]["httpGet"].update(host="10.0.0.1"), "host"),
]


@pytest.mark.parametrize(("change", "names"), BROKEN, ids=[n for _, n in BROKEN])
def test_a_pod_breaking_a_control_is_refused_by_the_admission(control_plane, cluster_namespace, change, names):
    pod = next(p for p in pods_of(REPO / "examples" / "lapscluster-minimal.yaml", cluster_namespace)
               if p["metadata"]["labels"]["laps.io/role"] == "decode")
    change(pod["spec"])
    result = create(control_plane, cluster_namespace, pod)
    print(result.stderr)
    assert result.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in result.stderr and names in result.stderr, result.stderr


def test_the_add_back_the_level_allows_is_admitted(control_plane, cluster_namespace):
    pod = pods_of(REPO / "examples" / "lapscluster-minimal.yaml", cluster_namespace)[0]
    _container(pod["spec"])["securityContext"]["capabilities"]["add"] = ["NET_BIND_SERVICE"]
    assert create(control_plane, cluster_namespace, pod).returncode == 0
