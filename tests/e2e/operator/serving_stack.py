"""A serving data plane on loopback for the operator's end-to-end tests: emulated engines (real
`laps engine --backend emulated` processes: the engine protocol with batch times from a cost
model, computing nothing), the Pod objects that stand for them in the API emulator, a stand-in
for the controllers the emulator lacks, and a load generator.

What the emulator cannot show, and who plays it here:
- no StatefulSet/Deployment controller and no kubelet: `pod_for` makes the Pod a controller
  would (the template's labels, an owner reference) and reports it Running and Ready at
  127.0.0.1, with container ports where the engine process really listens (all engines share
  127.0.0.1, so each has its own ports, unlike pods on a real network);
- no endpoints controller and no downward API: `Controllers` rewrites the EndpointSlices of
  every Service whenever the pods change (`sync_endpoint_slices`, one slice per Service and pod)
  and rewrites each engine's labels file when its pod's labels change, as the kubelet does.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import kubernetes
import yaml

from laps_agent.local.engines import free_ports
from tests.support.emulated_profiles import synthetic_profile
from tests.support.fixtures_engines import wait_healthy
from tests.support.fixtures_gateway_k8s import sync_endpoint_slices
from tests.support.get_server import GetServer
from tests.support.metrics_text import metric_value
from tests.support.waiting import stop_process

NS = "default"
# Long prompts keep a prefill pod busy (2000 tokens: 0.8 s), short ones do not (0.04 s), so the
# gateway's pending tokens follow which class the load is made of.
PROFILE = synthetic_profile("e2e-alloc", served="e2e-model", engine={"kv_capacity_tokens": 262144, "max_prefill_tokens": 4096},
                            prefill={"per_token_s": 0.0004}, transfer={"latency_s": 0.001})
SERVED = PROFILE["model"]["name"]


@dataclass
class Engine:
    name: str
    role: str
    port: int
    bootstrap_port: int | None
    labels_path: Path
    log_path: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metric(self, name: str, **labels: str) -> float:
        """0 while the series is absent (a histogram child before its first observation)."""
        return metric_value(httpx.get(self.url + "/metrics", timeout=5).text, name, 0.0, **labels)


def write_labels(path: Path, labels: dict[str, str]) -> None:
    """The downward API's `labels` file: `key="value"` lines, swapped in whole."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f'{k}="{v}"\n' for k, v in sorted(labels.items())))
    tmp.replace(path)


def start_engines(names_roles: list[tuple[str, str]], workdir: Path, threshold: int) -> list[Engine]:
    """Start every engine at once, then wait for all of them (they start in ~2 s each)."""
    profile = workdir / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    engines = []
    for name, role in names_roles:
        port, bootstrap = free_ports(2)
        bootstrap = bootstrap if role == "prefill" else None
        labels, log = workdir / f"{name}.labels", workdir / f"{name}.log"
        write_labels(labels, {})
        argv = [sys.executable, "-m", "laps_agent.cli", "engine", "--backend", "emulated", "--profile", str(profile),
                "--role", role, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED,
                "--length-threshold", str(threshold), "--labels-file", str(labels)]
        if bootstrap is not None:
            argv += ["--bootstrap-port", str(bootstrap)]
        with open(log, "wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
        engines.append(Engine(name, role, port, bootstrap, labels, log, process))
    for engine in engines:
        wait_healthy(engine.url, engine.process, lambda e=engine: e.log_path.read_text()[-3000:], 120)
    return engines


def stop_engines(engines: list[Engine]) -> None:
    for engine in engines:
        stop_process(engine.process, signal.SIGTERM, 15)


def pod_for(name: str, template_labels: dict[str, str], owner: tuple[str, str, str], ports: dict[str, int]) -> dict:
    """The Pod a workload controller would make (owner = (kind, name, uid)), with the container
    ports where the process behind it listens on 127.0.0.1."""
    kind, owner_name, uid = owner
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict(template_labels), "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": kind, "name": owner_name, "uid": uid, "controller": True}]},
            "spec": {"containers": [{"name": "main", "image": "laps",
                                     "ports": [{"name": k, "containerPort": v, "protocol": "TCP"}
                                               for k, v in ports.items()]}]}}


def run_pod(core, pod: dict) -> None:
    """Create the pod and report it Running and Ready at 127.0.0.1, as the kubelet would."""
    core.create_namespaced_pod(NS, pod)
    core.patch_namespaced_pod_status(pod["metadata"]["name"], NS, {"status": {
        "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        "conditions": [{"type": "Ready", "status": "True"}]}})


class Controllers(threading.Thread):
    """The endpoints controller and the kubelet's downward-API refresh, every 0.2 s."""

    def __init__(self, kube_api, engines: list[Engine]) -> None:
        super().__init__(name="controllers", daemon=True)
        client = kube_api.api_client()
        self.core = kubernetes.client.CoreV1Api(client)
        self.slices = kubernetes.client.DiscoveryV1Api(client)
        self.engines = {e.name: e for e in engines}
        self.stopped = threading.Event()
        self.errors: list[str] = []
        self.rounds = 0

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            try:
                sync_endpoint_slices(self.core, self.slices)
                for pod in self.core.list_namespaced_pod(NS).items:
                    engine = self.engines.get(pod.metadata.name)
                    if engine is not None:
                        labels = dict(pod.metadata.labels or {})
                        if engine.labels_path.read_text() != "".join(f'{k}="{v}"\n' for k, v in sorted(labels.items())):
                            write_labels(engine.labels_path, labels)
                self.rounds += 1
            except Exception as exc:  # noqa: BLE001 - reported by the test, the loop goes on
                self.errors.append(repr(exc))

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


@dataclass
class Load:
    """Clients sending /v1/completions of `tokens` prompt tokens through the gateway, each
    waiting for its answer before sending the next (closed loop)."""
    url: str
    tokens: int
    clients: int
    done: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for i in range(self.clients):
            thread = threading.Thread(target=self._client, args=(i,), daemon=True, name=f"load-{self.tokens}-{i}")
            thread.start()
            self._threads.append(thread)
        return self

    def _client(self, seed: int) -> None:
        with httpx.Client(timeout=60, trust_env=False) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                prompt = [1000 + (seed * 7919 + n * 31 + i) % 20000 for i in range(self.tokens)]
                try:
                    reply = client.post(self.url + "/v1/completions",
                                        json={"model": SERVED, "prompt": prompt, "max_tokens": 1})
                    if reply.status_code == 200:
                        self.done += 1
                    else:
                        self.failures.append(f"{reply.status_code}: {reply.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


class GatewayStandIn:
    """A gateway pod's /metrics: its offered prefill seconds per class, growing at the rate the
    test sets (`pressure`: seconds of prefill work per second, the allocation loop's unit)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offered = {"short": 0.0, "long": 0.0}
        self._rate = {"short": 0.0, "long": 0.0}
        self._since = time.monotonic()
        self._http = GetServer(self._metrics)
        self.port = self._http.port

    @property
    def pressure(self) -> dict[str, float]:
        return dict(self._rate)

    @pressure.setter
    def pressure(self, rate: dict[str, float]) -> None:
        with self._lock:
            self._advance()
            self._rate = dict(rate)

    def _advance(self) -> None:
        now = time.monotonic()
        for cls, rate in self._rate.items():
            self._offered[cls] += rate * (now - self._since)
        self._since = now

    def _metrics(self) -> tuple[str, bytes]:
        with self._lock:
            self._advance()
            return "text/plain; version=0.0.4", "".join(
                f'laps_gateway_offered_prefill_seconds_total{{class="{c}"}} {v}\n'
                for c, v in self._offered.items()).encode()

    def close(self) -> None:
        self._http.close()
