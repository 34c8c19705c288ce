"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (fake nodes), built from their Go modules by
scripts/build_controlplane.sh, started in a temp dir and stopped by PID.

The API server runs as a cluster's does: TLS, RBAC (no other authoriser), ServiceAccount tokens
(TokenRequest, signed with a key of this run), the default admission plugins (Pod Security among
them) plus OwnerReferencesPermissionEnforcement, which kubeadm clusters do not enable but
OpenShift and hardened clusters do. The controller-manager runs each controller with its own
ServiceAccount (--use-service-account-credentials, as kubeadm does), so its RBAC is real too.
kwok plays the kubelets of two nodes (heartbeats and leases, so the node-lifecycle controller lifts
the not-ready taint and keeps them): a scheduled pod becomes Running and Ready with an IP from
10.244.0.0/16; no container runs.

What it cannot show: containers (kwok runs none: probes, images, mounted tokens and the pods'
own processes are never exercised), kube-proxy (Service IPs route nowhere), DNS, a CNI.
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass, field

import yaml

from tests.support.waiting import poll, stop_process

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build_controlplane.sh"
ADMIN_TOKEN = "laps-test-admin-token"
# Nodes kwok manages: enough for every pool of the examples (GPU pools included).
NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
NODE_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8",
                 "ephemeral-storage": "1Ti"}
NODES = ("kwok-node-0", "kwok-node-1")
_START_TIMEOUT_S = 120.0


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message says which part and why."""


def build() -> pathlib.Path:
    """The directory of the built binaries (building them the first time: minutes)."""
    result = subprocess.run([str(BUILD_SCRIPT)], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT.name} failed (exit {result.returncode}):\n"
                                f"{result.stderr[-4000:]}")
    return pathlib.Path(result.stdout.strip().splitlines()[-1])


def _free_ports(n: int) -> list[int]:
    from laps_agent.local.engines import free_ports

    return free_ports(n)


def _service_account_key(path: pathlib.Path) -> None:
    """An RSA key pair: the API server signs ServiceAccount tokens with it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


@dataclass
class _Process:
    name: str
    process: subprocess.Popen
    log: pathlib.Path

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@dataclass
class ControlPlane:
    """A started control plane. `kubeconfig` authenticates as a cluster admin (system:masters);
    `kubeconfig_for` as a ServiceAccount; `kubectl(...)` runs the kubectl of the same build."""
    workdir: pathlib.Path
    bin_dir: pathlib.Path
    url: str = ""
    kubeconfig: pathlib.Path = pathlib.Path()
    ca_file: pathlib.Path = pathlib.Path()
    version: str = ""
    startup_s: float = 0.0
    _processes: list[_Process] = field(default_factory=list)
    _audit: list[dict] = field(default_factory=list)
    _audit_offset: int = 0

    @property
    def audit_log(self) -> pathlib.Path:
        return self.workdir / "audit.log"

    # --- start and stop ---------------------------------------------------------------------

    def start(self) -> None:
        began = time.monotonic()
        self.version = (self.bin_dir / ".built").read_text().strip()
        etcd_port, peer_port, api_port, cm_port, sched_port, kwok_port = _free_ports(6)
        data = self.workdir
        pki = data / "pki"
        pki.mkdir(parents=True)
        _service_account_key(pki / "sa.key")
        (pki / "tokens.csv").write_text(f'{ADMIN_TOKEN},laps-test-admin,laps-test-admin,"system:masters"\n')
        self._spawn("etcd", [
            "--name", "laps-test", "--data-dir", str(data / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"laps-test=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",  # a throw-away store: durability buys nothing here
            "--log-level", "warn"])
        self._spawn("kube-apiserver", [
            "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            # The `kubernetes` Service's endpoints may not be a loopback address: none are kept.
            "--endpoint-reconciler-type", "none",
            "--secure-port", str(api_port), "--cert-dir", str(pki),
            "--authorization-mode", "RBAC",
            "--token-auth-file", str(pki / "tokens.csv"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/16",
            "--enable-admission-plugins", "OwnerReferencesPermissionEnforcement",
            "--allow-privileged=true",   # as kubeadm: Pod Security, not this flag, refuses privileged pods
            # Every request of a ServiceAccount outside kube-system (the operator's, the gateway's),
            # written before it is answered: what tests/cluster reads refusals and usage from.
            "--audit-policy-file", str(self._audit_policy()), "--audit-log-path", str(self.audit_log),
            "--audit-log-mode", "blocking", "--audit-log-format", "json"])
        self.url = f"https://127.0.0.1:{api_port}"
        self.ca_file = pki / "apiserver.crt"
        self.kubeconfig = data / "admin.kubeconfig"
        self._wait(lambda: self.ca_file.exists() and self._ready(), "kube-apiserver /readyz")
        self.kubeconfig.write_text(self._kubeconfig_text(ADMIN_TOKEN, "default"))
        self._spawn("kube-controller-manager", [
            "--kubeconfig", str(self.kubeconfig), "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(cm_port),
            "--use-service-account-credentials",
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(self.ca_file),
            "--controllers", ",".join((
                "garbage-collector-controller", "namespace-controller", "node-lifecycle-controller",
                "statefulset-controller", "deployment-controller", "replicaset-controller",
                "endpointslice-controller", "endpointslice-mirroring-controller",
                "serviceaccount-controller", "serviceaccount-token-controller", "clusterrole-aggregation-controller",
                "root-ca-certificate-publisher-controller"))])
        self._spawn("kube-scheduler", [
            "--kubeconfig", str(self.kubeconfig), "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(sched_port)])
        self._spawn("kwok", [
            "--kubeconfig", str(self.kubeconfig), "--config", str(self.bin_dir / "kwok-stages.yaml"),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector", "=".join(NODE_ANNOTATION),
            "--cidr", "10.244.0.1/16", "--node-ip", "10.0.0.1", "--node-lease-duration-seconds", "40",
            "--server-address", f"127.0.0.1:{kwok_port}"])
        for node in NODES:
            self.kubectl_json("create", "-f", "-", stdin=yaml.safe_dump(_node(node)))
        self._wait(self._settled, "nodes Ready and the default ServiceAccount created")
        self.startup_s = time.monotonic() - began

    def _audit_policy(self) -> pathlib.Path:
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
                      {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
                      {"level": "None"}]}))
        return path

    def audit(self, since: int = 0) -> list[dict]:
        """The audit log's events from the `since`-th on (ServiceAccounts outside kube-system):
        user, verb, objectRef, responseStatus, annotations (the authoriser's decision and reason)."""
        if self.audit_log.exists():
            with self.audit_log.open("rb") as log:
                log.seek(self._audit_offset)
                chunk = log.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]
            self._audit_offset += len(complete)
            self._audit += [json.loads(line) for line in complete.splitlines() if line.strip()]
        return self._audit[since:]

    def stop(self) -> None:
        for proc in reversed(self._processes):
            stop_process(proc.process, signal.SIGTERM, 15)
        self._processes.clear()

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen([str(self.bin_dir / "bin" / name), *args], stdout=out,
                                       stderr=subprocess.STDOUT, cwd=self.workdir,
                                       env={**os.environ, "HOME": str(self.workdir)})
        self._processes.append(_Process(name, process, log))

    def _wait(self, condition, what: str) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not condition():
            for proc in self._processes:
                if proc.process.poll() is not None:
                    raise ControlPlaneError(f"{proc.name} exited with {proc.process.returncode} "
                                            f"while waiting for {what}:\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out after {_START_TIMEOUT_S:.0f}s waiting for {what}")
            time.sleep(0.2)  # poll interval, bounded by the deadline above

    def _ready(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url}/readyz", verify=ssl.create_default_context(cafile=self.ca_file), timeout=2,
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
        except (httpx.HTTPError, OSError):
            return False

    def _settled(self) -> bool:
        nodes = self.kubectl_json("get", "nodes", check=False) or {"items": []}
        ready = [n for n in nodes["items"] if any(c["type"] == "Ready" and c["status"] == "True"
                                                   for c in n.get("status", {}).get("conditions", []))]
        account = self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
        return len(ready) == len(NODES) and account.returncode == 0

    # --- clients ------------------------------------------------------------------------------

    def _kubeconfig_text(self, token: str, namespace: str) -> str:
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test",
                                                       "namespace": namespace}}]})

    def token_for(self, namespace: str, service_account: str) -> str:
        """A token of that ServiceAccount from the TokenRequest API, as a kubelet mounts one."""
        return self.kubectl("create", "token", service_account, "-n", namespace,
                            "--duration", "2h").stdout.strip()

    def kubeconfig_for(self, namespace: str, service_account: str) -> pathlib.Path:
        path = self.workdir / f"kubeconfig-{namespace}-{service_account}.yaml"
        path.write_text(self._kubeconfig_text(self.token_for(namespace, service_account), namespace))
        return path

    def kubectl(self, *args: str, stdin: str | None = None, kubeconfig: pathlib.Path | None = None,
                check: bool = True) -> subprocess.CompletedProcess:
        """`kubectl ARGS` (the build's own kubectl) as the admin or another kubeconfig."""
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig),
               "KUBECACHEDIR": str(self.workdir / "kube-cache"), "HOME": str(self.workdir)}
        result = subprocess.run([str(self.bin_dir / "bin" / "kubectl"), *args], input=stdin,
                                capture_output=True, text=True, env=env, timeout=60)
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def wait_owner_kind_known(self, api_version: str, kind: str, timeout: float = 90.0) -> None:
        """Wait until the API server's admission can map `kind` (a CRD's): the
        OwnerReferencesPermissionEnforcement plugin looks an owner's kind up in kube-apiserver's
        own discovery cache, and while that does not know it, it refuses any child with
        `blockOwnerDeletion` to that kind ("cannot find RESTMapping"), whoever asks. Seen once
        in make test, right after a chart install on a worker's control plane; not reproduced
        alone (a CRD created, deleted and re-created there was mapped within 0.1 s each time),
        so the tests wait for it rather than assume it. Probed with a server-side dry run of
        such a child."""
        probe = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "laps-owner-kind-probe", "namespace": "default", "ownerReferences": [{
                "apiVersion": api_version, "kind": kind, "name": "probe", "blockOwnerDeletion": True,
                "uid": "00000000-0000-0000-0000-000000000000"}]}})

        def known() -> bool:
            result = self.kubectl("create", "--dry-run=server", "-f", "-", stdin=probe, check=False)
            if result.returncode != 0 and "cannot find RESTMapping" not in result.stderr:
                raise ControlPlaneError(f"the owner-kind probe failed: {result.stderr}")
            return result.returncode == 0

        poll(known, timeout=timeout, interval=0.5, message=f"admission to know the kind {kind} ({api_version})")

    def kubectl_json(self, *args: str, **kwargs) -> dict | None:
        result = self.kubectl(*args, "-o", "json", **kwargs)
        if result.returncode != 0:
            return None
        return json.loads(result.stdout)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.tail(2000)}" for p in self._processes)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def _node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": dict([NODE_ANNOTATION]),
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "type": "kwok"}},
            "status": {"capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY}}
