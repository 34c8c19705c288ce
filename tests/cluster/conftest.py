"""The real programs against the real control plane: `laps operator` and `laps gateway` as
processes, each with the credentials it would have in its pod (a kubeconfig of its
ServiceAccount's token), stopped at the end of the test, their logs printed (pytest shows them
when the test failed)."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

import httpx
import pytest

from laps_agent.local.engines import free_ports
from laps_operator.naming import API_VERSION, CRD_NAME, KIND
from tests.cluster.story import wait_for
from tests.support.waiting import stop_process

REPO = pathlib.Path(__file__).resolve().parents[2]


class _Program:
    def __init__(self, argv: list[str], log: pathlib.Path, kubeconfig: pathlib.Path, env: dict[str, str]) -> None:
        self.log_path = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                env={**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1", **env})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.process, signal.SIGINT, 15)   # SIGINT: kopf's graceful shutdown

    def alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.log_path.stem} exited with {self.process.returncode}:\n{self.log()[-3000:]}")


@pytest.fixture
def programs(tmp_path: pathlib.Path) -> Iterator[tuple[Callable[..., str], Callable[..., str]]]:
    """(start_operator(kubeconfig, **env) -> the process, start_gateway(kubeconfig, args) -> its URL)."""
    started: list[_Program] = []

    def start_operator(kubeconfig: pathlib.Path, **env: str) -> _Program:
        metrics, liveness = free_ports(2)
        program = _Program([sys.executable, "-m", "laps_agent.cli", "operator", "--kubeconfig", str(kubeconfig),
                            "--all-namespaces", "--bind", "127.0.0.1", "--metrics-port", str(metrics),
                            "--liveness-port", str(liveness)],
                           tmp_path / f"operator-{len(started)}.log", kubeconfig, env)
        started.append(program)

        def live() -> bool:
            program.alive()
            return httpx.get(f"http://127.0.0.1:{liveness}/healthz", timeout=2).status_code == 200
        wait_for(live, "the operator's liveness endpoint")
        program.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        return program

    def start_gateway(kubeconfig: pathlib.Path, args: tuple[str, ...]) -> str:
        program = _Program([sys.executable, "-m", "laps_agent.cli", "gateway", *args],
                           tmp_path / f"gateway-{len(started)}.log", kubeconfig, {})
        started.append(program)

        def listening() -> str | None:
            program.alive()
            for line in program.log().splitlines():
                if line.startswith("laps gateway listening on "):
                    return line.rsplit(" ", 1)[1]
            return None
        return wait_for(listening, "laps gateway to print its address")

    try:
        yield start_operator, start_gateway
    finally:
        for program in started:
            program.stop()
        for program in started:
            print(f"--- {program.log_path.name} ---\n{program.log()[-6000:]}")


class RealKubeApi:
    """The real control plane under the name and interface of the emulator's `kube_api`
    (`api_client()`, `kubeconfig`, `url`, `http`, `apply_crd`), so that a test written against
    the emulator with the official client runs here unchanged (in namespace `default`, as there)."""

    def __init__(self, control_plane) -> None:
        self.control_plane, self.kubeconfig, self.url = control_plane, control_plane.kubeconfig, control_plane.url
        self._clients: list = []
        self._http = None
        self._crds: list = []

    @property
    def http(self):
        import ssl

        from tests.support.controlplane import ADMIN_TOKEN

        if self._http is None:
            self._http = httpx.Client(base_url=self.url, timeout=30,
                                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                                      verify=ssl.create_default_context(cafile=self.control_plane.ca_file))
        return self._http

    def apply_crd(self, path) -> None:
        """As the emulator's; the CRD is deleted after the test (its kinds would outlive it here:
        the samples' category `laps` would even turn `kubectl get laps` into a list of them)."""
        self.control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        self.control_plane.kubectl("wait", "--for=condition=Established", "-f", str(path))
        self._crds.append(path)

    def api_client(self):
        import kubernetes

        client = kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()
        if self._http is not None:
            self._http.close()
        for path in self._crds:
            self.control_plane.kubectl("delete", "--ignore-not-found", "--timeout=60s", "-f", str(path), check=False)


@pytest.fixture
def kube_api(control_plane) -> Iterator[RealKubeApi]:
    api = RealKubeApi(control_plane)
    try:
        yield api
    finally:
        api.close()
        # What the test left in `default` (the emulator starts empty every test): every kind there.
        kinds = control_plane.kubectl("api-resources", "--namespaced", "--verbs=delete", "-o", "name").stdout.split()
        control_plane.kubectl("delete", ",".join(k for k in kinds if k not in ("events", "events.events.k8s.io")),
                              "-n", "default", "--field-selector", "metadata.name!=default,metadata.name!=kube-root-ca.crt",
                              "--grace-period=0", "--force", "--timeout=60s", check=False)



@pytest.fixture
def start_operator(control_plane, programs):
    """`laps operator` as the cluster's admin, after `kubectl apply` of the chart's CRD; the
    LAPSClusters a test made in `default` are deleted after it."""
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "charts/laps/crds/lapscluster.yaml"))
    control_plane.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}")
    control_plane.wait_owner_kind_known(API_VERSION, KIND)

    def start(**env: str):
        return programs[0](control_plane.kubeconfig, **env)
    try:
        yield start
    finally:
        control_plane.kubectl("delete", "laps", "--all", "-n", "default", "--wait=false", check=False)
