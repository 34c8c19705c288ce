"""The real operator (`laps operator`, i.e. kopf) as a subprocess against the `kube_api` emulator."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from laps_agent.local.engines import free_ports
from tests.support.waiting import stop_process, wait_for  # noqa: F401 - the e2e tests import it from here

REPO = pathlib.Path(__file__).resolve().parents[3]
CRD = REPO / "charts" / "laps" / "crds" / "lapscluster.yaml"




@dataclass
class OperatorProcess:
    process: subprocess.Popen
    log_path: pathlib.Path
    metrics_url: str
    liveness_url: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels: str) -> float | None:
        text = httpx.get(self.metrics_url, timeout=5).text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series == (f"{name}{{{want}}}" if want else name):
                return float(value)
        return None

    def stop(self) -> None:
        stop_process(self.process, signal.SIGINT, 15)  # SIGINT: kopf's graceful shutdown


@pytest.fixture
def start_operator(kube_api, tmp_path) -> Iterator[Callable[..., OperatorProcess]]:
    """Start `laps operator` (as many times as a test needs, one at a time; keyword arguments
    are extra environment variables); all are stopped at the end, and their logs printed (pytest
    shows them when the test failed)."""
    kube_api.apply_crd(CRD)
    started: list[OperatorProcess] = []

    def start(*, kubeconfig: pathlib.Path | None = None, scope: tuple[str, ...] = ("--namespace", "default"),
              **env_overrides: str) -> OperatorProcess:
        """`kubeconfig`: whose credentials it runs with (default: the admin's); `scope`: the
        chart's `--all-namespaces` or `--namespace=...` arguments."""
        kubeconfig = kubeconfig or kube_api.kubeconfig
        metrics_port, liveness_port = free_ports(2)
        log_path = tmp_path / f"operator-{len(started)}.log"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1", **env_overrides}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "laps_agent.cli", "operator", "--kubeconfig", str(kubeconfig),
                 *scope, "--bind", "127.0.0.1", "--metrics-port", str(metrics_port),
                 "--liveness-port", str(liveness_port)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
            )
        op = OperatorProcess(process, log_path, f"http://127.0.0.1:{metrics_port}/metrics",
                             f"http://127.0.0.1:{liveness_port}/healthz")
        started.append(op)

        def alive() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"operator exited with {process.returncode}:\n{op.log()[-3000:]}")
            return httpx.get(op.liveness_url, timeout=2).status_code == 200

        wait_for(alive, "the operator's liveness endpoint", timeout=60)
        return op

    try:
        yield start
    finally:
        for op in started:
            op.stop()
        for op in started:
            print(f"--- {op.log_path.name} ---\n{op.log()[-6000:]}")
