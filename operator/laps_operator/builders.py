"""Pure builders: a LAPSCluster's typed spec -> the manifests of its children.

Every manifest carries the architecture's labels and an owner reference to the cluster, so a
reconcile is "apply each of these" and deletion is the garbage collector's job.
"""
from __future__ import annotations

import json
from typing import Any

from .engine_args import engine_command, gateway_command, model_visible_to_gateway, sglang_plugin_env
from .gateway_auth import gateway_auth
from .naming import (
    BOOTSTRAP_PORT,
    CLUSTER_LABEL,
    ENGINE_PORT,
    GROUP_LABEL,
    GROUPS,
    ROLE_LABEL,
    ClusterRef,
    component_labels,
    object_meta as _meta,
    role_selector,
)
from .network_policy import build_network_policies, network_policy_refs
from .pod_security import restricted
from .pressure import scrape_interval_seconds
from .spec import ClusterSpec, PoolSpec, ResourcesSpec

PODINFO_DIR = "/etc/podinfo"


def _resources(resources: ResourcesSpec, gpus: int | None = None) -> dict[str, Any]:
    # Quantities are strings in the API (an int is accepted but read back as a string), so
    # render them as strings: clients that parse typed objects reject numbers there.
    out: dict[str, Any] = {}
    if resources.requests:
        out["requests"] = {k: str(v) for k, v in resources.requests.items()}
    limits = {k: str(v) for k, v in resources.limits.items()}
    if gpus and "nvidia.com/gpu" not in limits:
        # A CUDA engine without a GPU limit would be scheduled onto a node with no GPU for it.
        limits["nvidia.com/gpu"] = str(gpus)
    if limits:
        out["limits"] = limits
    return out


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _pre_stop(spec: ClusterSpec) -> dict[str, Any]:
    """Container fields for a graceful shutdown: a preStop delay, during which the pod serves on
    while the endpoints controllers take it out of every Service (and the gateways' discovery);
    then SIGTERM starts its drain (laps_agent/drain.py, --drain-grace-s). An exec of `python`,
    which every image here has (the laps images, SGLang's), rather than the preStop `sleep`
    action (Kubernetes >= 1.30 only), the `sleep` binary (not in every image) or an httpGet
    (an SGLang engine has no endpoint for it)."""
    seconds = spec.drain.pre_stop_seconds
    if not seconds:
        return {}
    command = ["python", "-c", f"import time; time.sleep({seconds})"]
    return {"lifecycle": {"preStop": {"exec": {"command": command}}}}


def _model_volume(spec: ClusterSpec) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts) for the model volume, empty when the model is inside the image."""
    if spec.model.volume is None:
        return [], []
    volume = {"name": "model", **spec.model.volume}
    return [volume], [{"name": "model", "mountPath": spec.model.mount_path, "readOnly": True}]


def _engine_pod(cluster: ClusterRef, spec: ClusterSpec, role: str, pool: PoolSpec) -> dict[str, Any]:
    command, args = engine_command(spec, role)
    ports = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    if role == "prefill":
        ports.append({"name": "bootstrap", "containerPort": BOOTSTRAP_PORT, "protocol": "TCP"})
    env = [
        _field_env("POD_IP", "status.podIP"),
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        # SGLang's KV transfer advertises this address to its peers (else it guesses one).
        *([_field_env("SGLANG_HOST_IP", "status.podIP")] if spec.engine.backend == "sglang" else []),
        # Before the user's env, so an entry there with the same name wins.
        *sglang_plugin_env(spec, role),
        *(dict(e) for e in spec.engine.env),
    ]
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
    uses_gpu = spec.engine.device == "cuda" or spec.engine.backend == "sglang"
    container = {
        "name": "engine",
        "image": spec.engine.image,
        "imagePullPolicy": spec.engine.image_pull_policy,
        "command": command,
        "args": args,
        "ports": ports,
        "env": env,
        "volumeMounts": mounts,
        "resources": _resources(pool.resources, pool.tensor_parallel_size if uses_gpu else None),
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 360,  # loading a large model can take half an hour
        },
        **_pre_stop(spec),
    }
    pod_spec: dict[str, Any] = {"containers": [container], "volumes": volumes,
                                "terminationGracePeriodSeconds": spec.drain.grace_period_seconds}
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in pool.tolerations]
    if pool.affinity:
        pod_spec["affinity"] = dict(pool.affinity)
    # SGLang's image compiles kernels at run time into places we do not control.
    pod_spec = restricted(pod_spec, read_only_root=spec.engine.backend != "sglang")
    return {"metadata": {"labels": component_labels(cluster.name, role)}, "spec": pod_spec}


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


def _service(cluster: ClusterRef, name: str, component: str, selector: dict, ports: list[dict],
             **spec_extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(cluster, name, component),
        "spec": {"selector": selector, "ports": ports, **spec_extra},
    }


def _engine_ports(with_bootstrap: bool) -> list[dict]:
    ports = [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}]
    if with_bootstrap:
        ports.append({"name": "bootstrap", "port": BOOTSTRAP_PORT, "targetPort": "bootstrap", "protocol": "TCP"})
    return ports


def build_services(cluster: ClusterRef, spec: ClusterSpec) -> list[dict[str, Any]]:
    prefill = role_selector(cluster.name, "prefill")
    services = [
        # Headless: stable DNS per prefill pod, ready or not (bootstrap addresses are per pod).
        _service(cluster, cluster.prefill, "prefill", prefill, _engine_ports(True),
                 clusterIP="None", publishNotReadyAddresses=True),
    ]
    for group in GROUPS:
        services.append(_service(cluster, cluster.prefill_group_service(group), "prefill",
                                 {**prefill, GROUP_LABEL: group}, _engine_ports(True)))
    services.append(_service(cluster, cluster.decode, "decode", role_selector(cluster.name, "decode"),
                             _engine_ports(False)))
    gateway_ports = [{"name": "http", "port": spec.gateway.port, "targetPort": "http", "protocol": "TCP"}]
    services.append(_service(cluster, cluster.gateway, "gateway", role_selector(cluster.name, "gateway"),
                             gateway_ports, type=spec.gateway.service_type))
    return services


def build_gateway_rbac(cluster: ClusterRef, spec: ClusterSpec) -> list[dict[str, Any]]:
    """ServiceAccount + Role + RoleBinding letting the gateway discover engines (EndpointSlices)."""
    name = cluster.gateway
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cluster, name, "gateway")},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(cluster, name, "gateway"),
            # Exactly what discovery uses (list, then watch from that list's resourceVersion):
            # the least-privilege e2e test compares this with what the gateway really asks for.
            "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                       "verbs": ["list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(cluster, name, "gateway"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cluster.namespace}],
        },
    ]


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
        "ports": [{"name": "http", "containerPort": spec.gateway.port, "protocol": "TCP"}],
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
            "template": {
                "metadata": {"labels": component_labels(cluster.name, "gateway")},
                "spec": restricted({"serviceAccountName": cluster.gateway, "containers": [container],
                                    "volumes": volumes,
                                    "terminationGracePeriodSeconds": spec.drain.grace_period_seconds}),
            },
        },
    }


def build_config_map(cluster: ClusterRef, spec: ClusterSpec) -> dict[str, Any]:
    """The effective (defaulted) LAPS configuration, for humans and the allocation loop."""
    config = {
        "cluster": cluster.name,
        "services": {
            "prefill": cluster.prefill,
            "prefillShort": cluster.prefill_group_service("short"),
            "prefillLong": cluster.prefill_group_service("long"),
            "decode": cluster.decode,
            "gateway": cluster.gateway,
        },
        "laps": spec.laps.model_dump(mode="json", by_alias=True),
        "monitoring": spec.monitoring.model_dump(mode="json", by_alias=True),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(cluster, cluster.config, "config"),
        "data": {"laps.json": json.dumps(config, indent=2, sort_keys=True)},
    }


def build_pod_monitor(cluster: ClusterRef, spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(cluster, cluster.name, "config"),
        "spec": {
            "selector": {"matchLabels": {CLUSTER_LABEL: cluster.name}},
            # The allocation loop averages the gateways' pending work over its interval: scrape
            # at least twice per interval (pressure.scrape_interval_seconds).
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": _scrape_interval(spec)}],
            # Pods carry their role and group; keep them on the series for per-group dashboards.
            "podTargetLabels": [ROLE_LABEL, GROUP_LABEL],
        },
    }


def _scrape_interval(spec: ClusterSpec) -> str:
    alloc = spec.laps.allocation
    if not alloc.enabled:
        return "15s"
    ms = int(round(scrape_interval_seconds(alloc.interval_seconds) * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def build_children(cluster: ClusterRef, spec: ClusterSpec,
                   operator_namespace: str | None = None) -> list[dict[str, Any]]:
    """Everything the cluster should own, in creation order (config and RBAC before workloads).
    `operator_namespace`: where the operator runs, the only namespace its pods are let in from."""
    children = [build_config_map(cluster, spec), *build_gateway_rbac(cluster, spec)]
    children += build_services(cluster, spec)
    if spec.network_policy.enabled:  # before the pods they guard: never a moment unguarded
        children += build_network_policies(cluster, spec, operator_namespace)
    children += [
        build_prefill_statefulset(cluster, spec),
        build_decode_deployment(cluster, spec),
        build_gateway_deployment(cluster, spec),
    ]
    if spec.monitoring.pod_monitor:
        children.append(build_pod_monitor(cluster, spec))
    return children


def optional_children(cluster: ClusterRef, spec: ClusterSpec) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of children that exist only for some specs and must be removed
    when the spec no longer asks for them."""
    unwanted = [] if spec.monitoring.pod_monitor else [("monitoring.coreos.com/v1", "PodMonitor", cluster.name)]
    if not spec.network_policy.enabled:
        unwanted += network_policy_refs(cluster)
    return unwanted
