"""A real `kopf run --standalone` operator against the emulator: proof that kopf works on it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import kubernetes
import pytest

from tests.integration.kube_emulator.crd_samples import GROUP, PLURAL, VERSION, write_widget_crd

_DEADLINE_S = 60.0

HANDLERS = textwrap.dedent(f"""
    import kopf

    @kopf.on.create("{GROUP}", "{VERSION}", "{PLURAL}")
    def double_size(spec, patch, **_):
        patch.status["doubled"] = spec.get("size", 0) * 2

    @kopf.on.delete("{GROUP}", "{VERSION}", "{PLURAL}")
    def goodbye(body, **_):
        kopf.info(body, reason="Goodbye", message="deleted")  # posted as a core/v1 Event
""")


def _poll(predicate, what: str, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + _DEADLINE_S
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        if proc.poll() is not None:
            pytest.fail(f"kopf exited with {proc.returncode} before {what}:\n{log.read_text()}")
        time.sleep(0.2)  # polling interval, not synchronisation: the condition decides
    pytest.fail(f"timed out waiting for {what}; kopf log:\n{log.read_text()}")


@pytest.fixture
def kopf_operator(kube_api, tmp_path):
    kube_api.apply_crd(write_widget_crd(tmp_path))
    (tmp_path / "handlers.py").write_text(HANDLERS)
    log = tmp_path / "kopf.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", "default",
             str(tmp_path / "handlers.py")],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        yield proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_kopf_handler_patches_status_and_releases_its_finalizer(kube_api, kopf_operator):
    proc, log = kopf_operator
    objects = kubernetes.client.CustomObjectsApi(kube_api.api_client())
    objects.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 21}})

    def doubled():
        widget = objects.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w1")
        return (widget.get("status") or {}).get("doubled")

    assert _poll(doubled, "the create handler's status patch", proc, log) == 42
    widget = objects.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w1")
    assert widget["metadata"].get("finalizers"), "kopf guards objects that have delete handlers"

    objects.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w1")

    def gone():
        try:
            objects.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w1")
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    assert _poll(gone, "kopf to run the delete handler and remove its finalizer", proc, log)
    core = kubernetes.client.CoreV1Api(kube_api.api_client())
    assert _poll(lambda: any(e.involved_object.name == "w1" and e.reason == "Goodbye"
                             for e in core.list_namespaced_event("default").items),
                 "kopf to post the delete handler's Event", proc, log)
