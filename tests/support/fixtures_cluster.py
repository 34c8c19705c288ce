"""`control_plane`: one real Kubernetes control plane (tests/support/controlplane.py) for the
whole test session, started on first use; `cluster_namespace`: a fresh namespace in it per test,
with the restricted Pod Security level enforced, deleted (and its children collected) after.

Usage::

    def test_something(control_plane, cluster_namespace):
        control_plane.kubectl("apply", "-n", cluster_namespace, "-f", "examples/lapscluster.yaml")
        api = kubernetes.config.new_client_from_config(str(control_plane.kubeconfig))

The binaries are built by scripts/build_controlplane.sh the first time (minutes; `make test`
builds them in its set-up). A failure to build or start fails the tests that use it, with the
reason; nothing is skipped.
"""
from __future__ import annotations

import itertools
import pathlib
import re
import tempfile
from collections.abc import Iterator

import pytest

from tests.support.controlplane import ControlPlane, build

_started: list[ControlPlane] = []
_namespaces = itertools.count()
_reported: list[str] = []


def report(*lines: str) -> None:
    """Lines for the end of the test run's output, passed or not (what a reviewer should see,
    such as `kubectl get laps` as a user sees it)."""
    _reported.extend(lines)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    plane = ControlPlane(workdir=pathlib.Path(tempfile.mkdtemp(prefix="laps-controlplane-")),
                         bin_dir=build())
    try:
        plane.start()
    except BaseException:
        print(plane.logs())
        plane.stop()
        raise
    _started.append(plane)
    try:
        yield plane
    finally:
        plane.stop()
        plane.cleanup()


@pytest.fixture
def cluster_namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own for the test (Pod Security `restricted` enforced, as a production
    namespace would be), deleted afterwards without waiting for its finalisation."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"t{next(_namespaces)}-{request.node.name.lower()}")[:50].strip("-")
    control_plane.kubectl("create", "namespace", name)
    control_plane.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _summary() -> list[str]:
    return [*_reported, *(f"real control plane: Kubernetes {plane.version} (etcd, kube-apiserver, "
                          f"controller-manager, scheduler, kwok) started in {plane.startup_s:.1f} s"
                          for plane in _started)]


def pytest_sessionfinish(session) -> None:
    # On a pytest-xdist worker (make test runs two) the lines travel to the controller, which
    # prints the run's summary; the worker prints none.
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["laps_report"] = _summary()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    _reported.extend(getattr(node, "workeroutput", {}).get("laps_report", ()))


def pytest_terminal_summary(terminalreporter) -> None:
    for line in _summary():
        terminalreporter.write_line(line)
