"""The pod-running children of a LAPSCluster: the prefill StatefulSet and the decode and gateway
Deployments, with the container parts they share (resources, downward-API env, preStop, model
volume).

Separate from builders.py, which assembles every child, because this is where the pods are
shaped (probes, volumes, security, scheduling) and it changes for different reasons than the
Services, RBAC and config around them.
"""
from __future__ import annotations

from typing import Any

from laps_operator.naming import (
    BOOTSTRAP_PORT,
    ENGINE_PORT,
    GATEWAY_PORT,
    HTTP_PORT_NAME,
    ClusterRef,
    component_labels,
    role_selector,
)
from laps_operator.naming import object_meta as _meta
from laps_operator.render.engine_args import (
    engine_command,
    gateway_command,
    model_visible_to_gateway,
    sglang_plugin_env,
)
from laps_operator.render.gateway_auth import gateway_auth
from laps_operator.render.pod_security import restricted
from laps_operator.spec.cluster import ClusterSpec
from laps_operator.spec.formats import overcommittable
from laps_operator.spec.gpus import GPU, engine_gpus
from laps_operator.spec.pods import PlacementSpec, PoolSpec, ResourcesSpec

PODINFO_DIR = "/etc/podinfo"


def _resources(resources: ResourcesSpec, gpus: int | None = None) -> dict[str, Any]:
    # Quantities are strings in the API (an int is accepted but read back as a string), so
    # render them as strings: clients that parse typed objects reject numbers there.
    out: dict[str, Any] = {}
    if resources.requests:
        out["requests"] = {k: str(v) for k, v in resources.requests.items()}
    limits = {k: str(v) for k, v in resources.limits.items()}
    for name, value in resources.requests.items():
        # The API server refuses a request without a limit for what it never overcommits (GPUs and
        # other extended resources, hugepages); the count asked for is the one the pod holds.
        if not overcommittable(name):
            limits.setdefault(name, str(value))
    if gpus and GPU not in limits:
        # A CUDA engine without a GPU limit would be scheduled onto a node with no GPU for it.
        limits[GPU] = str(gpus)
    if limits:
        out["limits"] = limits
    return out


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _pre_stop(spec: ClusterSpec) -> dict[str, Any]:
    """Container fields for a graceful shutdown: a preStop delay, during which the pod serves on
    while the endpoints controllers take it out of every Service (and the gateways' discovery);
    then SIGTERM starts its drain (laps_agent/serving/drain.py, --drain-grace-s). An exec of `python3`,
    which every image here has (the laps images, SGLang's, whose engine command is python3 too;
    a bare `python` is missing from Debian/Ubuntu-based images), rather than the preStop `sleep`
    action (Kubernetes >= 1.30 only), the `sleep` binary (not in every image) or an httpGet
    (an SGLang engine has no endpoint for it)."""
    seconds = spec.drain.pre_stop_seconds
    if not seconds:
        return {}
    command = ["python3", "-c", f"import time; time.sleep({seconds})"]
    return {"lifecycle": {"preStop": {"exec": {"command": command}}}}


def _model_volume(spec: ClusterSpec) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts) for the model volume, empty when the model is inside the image."""
    if spec.model.volume is None:
        return [], []
    # A volume copied whole from a pod spec carries its own `name`: the mount refers to "model".
    volume = {**spec.model.volume, "name": "model"}
    return [volume], [{"name": "model", "mountPath": spec.model.mount_path, "readOnly": True}]


def _pod_spec(spec: ClusterSpec, placement: PlacementSpec, own_pods: dict[str, str], **fields: Any
              ) -> dict[str, Any]:
    """The pod-level fields every pod of the cluster shares (pull secrets, grace period) and the
    role's placement, around `fields` (containers, volumes, ...). `own_pods`: the role's selector."""
    pod_spec: dict[str, Any] = {**fields, "terminationGracePeriodSeconds": spec.drain.grace_period_seconds}
    if placement.priority_class_name:
        pod_spec["priorityClassName"] = placement.priority_class_name
    if placement.topology_spread_constraints:
        # Spreading replicas means counting the role's own pods: a constraint without a selector
        # counts those.
        pod_spec["topologySpreadConstraints"] = [c.in_pod(own_pods) for c in placement.topology_spread_constraints]
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": ref.name} for ref in spec.image_pull_secrets]
    if placement.node_selector:
        pod_spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        # As written: the fields left out (None) stay out, for the API server's own defaults.
        pod_spec["tolerations"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                                   for t in placement.tolerations]
    affinity = placement.affinity.model_dump(mode="json", by_alias=True, exclude_none=True) \
        if placement.affinity else {}
    if affinity:
        pod_spec["affinity"] = affinity
    return pod_spec


# Set by the operator, yet engine.env may replace them: a default nothing else relies on.
# SGLANG_HOST_IP: the address SGLang's KV transfer advertises, the pod IP unless a multi-NIC or
# RDMA node needs another.
USER_OVERRIDABLE_ENV = frozenset({"SGLANG_HOST_IP"})


def operator_env(spec: ClusterSpec, role: str) -> list[dict[str, Any]]:
    """The engine container's variables the operator sets. engine.env comes after them and may
    not name one but USER_OVERRIDABLE_ENV (overrides.py): the last of a name wins and would
    silently undo the CR."""
    return [
        _field_env("POD_IP", "status.podIP"),
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        # SGLang's KV transfer advertises this address to its peers (else it guesses one).
        *([_field_env("SGLANG_HOST_IP", "status.podIP")] if spec.engine.backend == "sglang" else []),
        *sglang_plugin_env(spec, role),
    ]


def _engine_pod(cluster: ClusterRef, spec: ClusterSpec, role: str, pool: PoolSpec) -> dict[str, Any]:
    command, args = engine_command(spec, role)
    ports = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    if role == "prefill":
        ports.append({"name": "bootstrap", "containerPort": BOOTSTRAP_PORT, "protocol": "TCP"})
    user_env = [dict(e) for e in spec.engine.env]
    given = {e["name"] for e in user_env}   # only USER_OVERRIDABLE_ENV can be among them
    env = [*(e for e in operator_env(spec, role) if e["name"] not in given), *user_env]
    volumes, mounts = _model_volume(spec)
    if role == "prefill":
        # The engine learns its group from its own labels, which the operator rewrites in place.
        volumes.append({
            "name": "podinfo",
            "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
        })
        mounts.append({"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True})
    if spec.engine.backend == "sglang":
        # NCCL and SGLang's tokenizer processes need more shared memory than the 64Mi default.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    # A GPU engine holds the GPUs it uses (gpus.py); a builtin one on device auto asks for none,
    # and neither backend on device cpu.
    uses_gpu = spec.engine.device == "cuda" or spec.engine.backend == "sglang"
    gpus = engine_gpus(spec.engine, pool) if uses_gpu else None
    container = {
        "name": "engine",
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": command,
        "args": args,
        "ports": ports,
        "env": env,
        "volumeMounts": mounts,
        "resources": _resources(pool.resources, gpus),
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 360,  # loading a large model can take half an hour
        },
        **_pre_stop(spec),
    }
    # SGLang's image compiles kernels at run time into places we do not control.
    pod_spec = restricted(_pod_spec(spec, pool, role_selector(cluster.name, role), containers=[container],
                                    volumes=volumes),
                          read_only_root=spec.engine.backend != "sglang")
    return _template(cluster, role, pool, pod_spec)


def _template(cluster: ClusterRef, role: str, placement: PlacementSpec, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A pod template: the CR's podLabels and podAnnotations with the operator's labels, which win
    (overrides.py refuses a CR that names one, so none is silently lost)."""
    metadata: dict[str, Any] = {"labels": {**placement.pod_labels, **component_labels(cluster.name, role)}}
    if placement.pod_annotations:
        metadata["annotations"] = dict(placement.pod_annotations)
    return {"metadata": metadata, "spec": pod_spec}


def build_prefill_statefulset(cluster: ClusterRef, spec: ClusterSpec) -> dict[str, Any]:
    # The group label is deliberately absent from the template: the operator writes it on the
    # pods, so moving a pod between groups restarts nothing.
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(cluster, cluster.prefill, "prefill"),
        "spec": {
            "serviceName": cluster.prefill,
            "replicas": spec.prefill.replicas,
            # Pods are independent engines: start and stop them together, not one by one.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": role_selector(cluster.name, "prefill")},
            "template": _engine_pod(cluster, spec, "prefill", spec.prefill),
        },
    }


def build_decode_deployment(cluster: ClusterRef, spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(cluster, cluster.decode, "decode"),
        "spec": {
            "replicas": spec.decode.replicas,
            "strategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": role_selector(cluster.name, "decode")},
            "template": _engine_pod(cluster, spec, "decode", spec.decode),
        },
    }


def build_gateway_deployment(cluster: ClusterRef, spec: ClusterSpec) -> dict[str, Any]:
    command, args = gateway_command(spec, cluster)
    volumes, mounts = _model_volume(spec) if model_visible_to_gateway(spec) else ([], [])
    auth_volumes, auth_mounts, auth_args = gateway_auth(spec)
    volumes, mounts, args = volumes + auth_volumes, mounts + auth_mounts, args + auth_args
    container = {
        "name": "gateway",
        "image": spec.gateway.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": command,
        "args": args,
        # The Service's port is spec.gateway.port, with this one as its target (naming.GATEWAY_PORT).
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "env": [_field_env("POD_NAMESPACE", "metadata.namespace")],
        "volumeMounts": mounts,
        "resources": _resources(spec.gateway.resources),
        # /health answers 503 until the gateway can route (a prefill and a decode pod known):
        # out of the Service until then, never restarted for it. /live answers while the
        # process serves; only a hung gateway fails it (three times in a row: 30 s).
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/live", "port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 3},
        **_pre_stop(spec),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(cluster, cluster.gateway, "gateway"),
        "spec": {
            "replicas": spec.gateway.replicas,
            "strategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": role_selector(cluster.name, "gateway")},
            "template": _template(cluster, "gateway", spec.gateway, restricted(_pod_spec(
                spec, spec.gateway, role_selector(cluster.name, "gateway"), serviceAccountName=cluster.gateway,
                containers=[container], volumes=volumes))),
        },
    }
