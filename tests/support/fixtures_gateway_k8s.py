"""Kubernetes-side helpers for gateway tests: pods that stand for stub engines on 127.0.0.1,
the operator's Services, a stand-in EndpointSlice controller, and `laps gateway` as a process.

Usage::

    core = kubernetes.client.CoreV1Api(kube_api.api_client())
    start_pod(core, stub_pod("pf-0", "prefill", server.port, group="short", bootstrap_port=7000))
    create_operator_services(core)          # <c>-prefill-short, -prefill-long, -decode, ...
    sync_endpoint_slices(core, kubernetes.client.DiscoveryV1Api(kube_api.api_client()))
    gateway = gateway_process("--discovery", "kubernetes", ..., "--port", "0")
    url = gateway.wait_listening()          # $KUBECONFIG (kube_api) points it at the emulator

Call `sync_endpoint_slices` again after changing pods (labels, readiness). Processes started
by `gateway_process` are killed (whole process group) at teardown, also on failure."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fixtures_gateway import poll

NS = "default"
CLUSTER = "c"
MANAGED_BY = {"endpointslice.kubernetes.io/managed-by": "test-endpointslice-controller"}


def _raw(response) -> list[dict]:
    return json.loads(response.data)["items"]


def stub_pod(name: str, role: str, http_port: int, *, group: str | None = None,
             bootstrap_port: int | None = None) -> dict:
    """A pod of cluster `CLUSTER` labelled as the operator labels engines, with its container
    ports (named `http`, `bootstrap`) set to where a stub engine listens."""
    from laps_operator.naming import GROUP_LABEL, role_selector  # loaded by every session: lazily

    labels = {**role_selector(CLUSTER, role), **({GROUP_LABEL: group} if group else {})}
    ports = [{"name": "http", "containerPort": http_port, "protocol": "TCP"}]
    if bootstrap_port is not None:
        ports.append({"name": "bootstrap", "containerPort": bootstrap_port, "protocol": "TCP"})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "engine", "image": "laps-stub", "ports": ports}]}}


def start_pod(core, pod: dict) -> None:
    """Create the pod and report it running and Ready on 127.0.0.1, as the kubelet would."""
    core.create_namespaced_pod(NS, pod)
    core.patch_namespaced_pod_status(pod["metadata"]["name"], NS, {"status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        "conditions": [{"type": "Ready", "status": "True"}]}})


def sync_endpoint_slices(core, slices_api) -> None:
    """Act as kube-controller-manager's EndpointSlice controller for the pods of `NS`.

    Not `kube_api.emulate_endpoint_slices()`: that one resolves a Service's named targetPort
    once per Service, right when every pod listens on the same port at its own IP. Here all the
    stub engines share 127.0.0.1 on ports of their own, and the real controller then puts pods
    with different port sets in different slices: one slice per (Service, pod)."""
    pods = _raw(core.list_namespaced_pod(NS, _preload_content=False))
    wanted: dict[str, dict] = {}
    for service in _raw(core.list_namespaced_service(NS, _preload_content=False)):
        selector = service["spec"].get("selector") or {}
        for pod in pods:
            labels, status = pod["metadata"].get("labels") or {}, pod.get("status") or {}
            if not selector or not status.get("podIP") or any(
                    labels.get(k) != v for k, v in selector.items()):
                continue
            named = {p["name"]: p["containerPort"]
                     for c in pod["spec"]["containers"] for p in c.get("ports") or ()}
            ports = [{"name": p["name"], "protocol": "TCP", "port": named[p["targetPort"]]
                      if isinstance(p["targetPort"], str) else p["targetPort"]}
                     for p in service["spec"]["ports"]
                     if not isinstance(p["targetPort"], str) or p["targetPort"] in named]
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in status.get("conditions") or ())
            name = f"{service['metadata']['name']}-{pod['metadata']['name']}"
            wanted[name] = {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/service-name": service["metadata"]["name"], **MANAGED_BY}},
                "ports": ports,
                "endpoints": [{"addresses": [status["podIP"]],
                               "conditions": {"ready": ready, "serving": ready, "terminating": False},
                               "targetRef": {"kind": "Pod", "namespace": NS,
                                             "name": pod["metadata"]["name"]}}]}
    selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
    existing = {s["metadata"]["name"]: s for s in _raw(slices_api.list_namespaced_endpoint_slice(
        NS, label_selector=selector, _preload_content=False))}
    # New and changed slices first, stale ones last: during a move the pod is briefly in both
    # groups, never in neither (the real controller gives no order between Services either).
    for name, body in wanted.items():
        if name not in existing:
            slices_api.create_namespaced_endpoint_slice(NS, body)
        elif any(existing[name].get(k) != body[k] for k in ("endpoints", "ports")):
            slices_api.patch_namespaced_endpoint_slice(name, NS, {
                "endpoints": body["endpoints"], "ports": body["ports"]})
    for name in existing.keys() - wanted.keys():
        slices_api.delete_namespaced_endpoint_slice(name, NS)


def create_operator_services(core) -> None:
    """The Services exactly as the operator builds them (so their port names are checked too)."""
    from laps_operator.naming import ClusterRef
    from laps_operator.render.builders import build_services
    from laps_operator.spec.cluster import parse_spec

    spec = parse_spec({"model": {"name": "stub", "path": "/models/stub.gguf"}})
    for service in build_services(ClusterRef(CLUSTER, NS, "uid-c"), spec):
        service["metadata"].pop("ownerReferences", None)  # no LAPSCluster object exists here
        core.create_namespaced_service(NS, service)


class GatewayProcess:
    """`laps gateway` in a process group of its own, its output in a file (a pipe nobody reads
    could fill and stall it)."""

    def __init__(self, argv: list[str], log_path: Path, env: dict) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log_file:
            self.proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_listening(self) -> str:
        def url():
            if self.proc.poll() is not None:
                raise AssertionError(f"laps gateway exited ({self.proc.returncode}):\n{self.output()}")
            for line in self.output().splitlines():
                if line.startswith("laps gateway listening on "):
                    return line.rsplit(" ", 1)[1]
            return None
        return poll(url, timeout=60, message="laps gateway to print its address")

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        if self.group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def gateway_process(tmp_path) -> Iterator:
    """start(*laps gateway args) -> GatewayProcess, output in tmp_path/gateway-N.log."""
    started: list[GatewayProcess] = []

    def start(*args: str) -> GatewayProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = GatewayProcess([sys.executable, "-m", "laps_agent.cli", "gateway", *args],
                                 tmp_path / f"gateway-{len(started)}.log", env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
