"""A real Prometheus server (the `prometheus` binary) scraping loopback targets, for tests that
check what the metrics look like once scraped and queried (dashboards, the allocation loop).

Stable API:
- `ScrapeTarget(url, pod, labels={}, metrics_path="/metrics")`: one endpoint to scrape; `pod`
  and `labels` become series labels, like the Kubernetes relabelling of a ServiceMonitor would.
- `run_prometheus(targets, workdir, ...)`: context manager -> `PrometheusServer` started on a
  free loopback port with storage under `workdir`, ready (`/-/ready`); stopped by PID on exit.
- fixture `prometheus_binary` (session): the binary's path; skips the test when it is absent.
- fixture `prometheus_server`: `start(targets, **run_prometheus options) -> PrometheusServer`,
  each one stopped at teardown (also on failure).
- `PrometheusServer.query(expr)` (raises `PrometheusQueryError` for an invalid query),
  `.wait_for(expr, predicate, timeout)`, `.targets()`, `.wait_targets_up(timeout)`, `.stop()`.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from laps_agent.local.engines import free_ports
from tests.support.waiting import stop_process

DEFAULT_BINARY = "/usr/bin/prometheus"
# The namespace label the chart's dashboards select on; "local" marks a stack outside Kubernetes.
DEFAULT_NAMESPACE = "local"


class PrometheusQueryError(AssertionError):
    """Prometheus refused a query (bad PromQL) or an API call failed."""


@dataclass(frozen=True)
class ScrapeTarget:
    url: str                                   # base URL, http://host:port
    pod: str                                   # value of the `pod` label
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"

    @property
    def address(self) -> str:
        return urlsplit(self.url).netloc


def find_prometheus_binary() -> str | None:
    configured = os.environ.get("LAPS_PROMETHEUS_BINARY", DEFAULT_BINARY)
    if Path(configured).is_file() and os.access(configured, os.X_OK):
        return configured
    return shutil.which("prometheus")


def render_config(targets: Sequence[ScrapeTarget], *, scrape_interval: str = "1s",
                  namespace: str = DEFAULT_NAMESPACE, job: str = "laps") -> str:
    """Prometheus configuration (JSON is valid YAML) with one static scrape job."""
    static_configs = [
        {"targets": [t.address],
         "labels": {**t.labels, "pod": t.pod, "__metrics_path__": t.metrics_path}}
        for t in targets]
    config = {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                   "evaluation_interval": scrape_interval},
        "scrape_configs": [{
            "job_name": job,
            "static_configs": static_configs,
            # What the ServiceMonitor's Kubernetes service discovery gives every series in a
            # cluster; the dashboards select on it.
            "relabel_configs": [{"target_label": "namespace", "replacement": namespace}],
        }],
    }
    return json.dumps(config, indent=1)


def _free_port() -> int:
    # A seam: a test that restarts Prometheus on the port it had replaces it.
    return free_ports(1)[0]


class PrometheusServer:
    def __init__(self, binary: str, config_path: Path, storage_dir: Path, log_path: Path,
                 targets: Sequence[ScrapeTarget]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path, self.storage_dir, self.log_path = config_path, storage_dir, log_path
        self.expected_targets = tuple(targets)
        argv = [binary, f"--config.file={config_path}", f"--storage.tsdb.path={storage_dir}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
                "--log.level=info"]
        # One OS thread for Go: the test machine's cores are shared with engines and other tests.
        env = {**os.environ, "GOMAXPROCS": os.environ.get("GOMAXPROCS", "1")}
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env)
        self._client = httpx.Client(base_url=self.url, timeout=10.0, trust_env=False)

    # lifecycle
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                if self._client.get("/-/ready", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready within {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)  # poll interval, bounded by the deadline

    def stop(self, timeout: float = 10.0) -> None:
        self._client.close()
        stop_process(self.process, signal.SIGTERM, timeout)

    # HTTP API
    def api(self, path: str, **params) -> object:
        """`data` of a `/api/v1/...` answer; PrometheusQueryError with Prometheus's message on
        an error status."""
        response = self._client.get(f"/api/v1/{path}", params=params)
        try:
            body = response.json()
        except ValueError:
            raise PrometheusQueryError(
                f"{path}: HTTP {response.status_code}: {response.text[:500]}") from None
        if body.get("status") != "success":
            raise PrometheusQueryError(
                f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant vector result of `expr` (a list of {"metric", "value"}); scalars and strings
        come back as a one-element list with an empty metric."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def wait_for(self, expr: str, predicate: Callable[[list[dict]], bool] = bool,
                 timeout: float = 20.0) -> list[dict]:
        """Poll `expr` until `predicate(result)` holds; AssertionError with the last result."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout}s {expr!r} still gives {result!r}")
            time.sleep(0.25)  # poll interval (a quarter of the scrape interval), bounded

    def targets(self) -> list[dict]:
        return self.api("targets", state="active")["activeTargets"]

    def wait_targets_up(self, timeout: float = 20.0) -> list[dict]:
        """Wait until every configured target was scraped successfully."""
        expected = {t.address for t in self.expected_targets}
        deadline = time.monotonic() + timeout
        while True:
            active = self.targets()
            up = {t["labels"]["instance"] for t in active if t["health"] == "up"}
            if expected <= up:
                return active
            if time.monotonic() > deadline:
                states = {t["labels"]["instance"]: (t["health"], t.get("lastError"))
                          for t in active}
                raise AssertionError(f"targets not all up after {timeout}s: {states}")
            time.sleep(0.2)  # poll interval, bounded by the deadline


@contextmanager
def run_prometheus(targets: Sequence[ScrapeTarget], workdir: Path, *,
                   binary: str | None = None, scrape_interval: str = "1s",
                   namespace: str = DEFAULT_NAMESPACE,
                   startup_timeout: float = 30.0) -> Iterator[PrometheusServer]:
    binary = binary or find_prometheus_binary()
    if binary is None:
        raise FileNotFoundError("no prometheus binary (set LAPS_PROMETHEUS_BINARY)")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(render_config(targets, scrape_interval=scrape_interval,
                                         namespace=namespace))
    server = None
    # The free port is released before Prometheus binds it; another process may take it in
    # between, so a failed start is retried on a fresh port.
    for attempt in range(3):
        server = PrometheusServer(binary, config_path, workdir / "data", workdir / "prometheus.log",
                                  targets)
        try:
            server.wait_ready(startup_timeout)
            break
        except RuntimeError:
            server.stop()
            if attempt == 2 or "address already in use" not in server.log_tail():
                raise
        except BaseException:
            server.stop()
            raise
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    binary = find_prometheus_binary()
    if binary is None:
        pytest.skip(f"Prometheus binary not installed ({DEFAULT_BINARY}; `make test` installs it)")
    return binary


@pytest.fixture
def prometheus_server(prometheus_binary, tmp_path_factory):
    """start(targets, **run_prometheus options) -> a ready PrometheusServer, stopped at teardown."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        def start(targets: Sequence[ScrapeTarget], **options) -> PrometheusServer:
            options.setdefault("binary", prometheus_binary)
            workdir = tmp_path_factory.mktemp("prometheus")
            return stack.enter_context(run_prometheus(targets, workdir, **options))

        yield start
