"""Two operator processes briefly at once, as when a node drain evicts the operator's pod: its
ReplicaSet starts the replacement while the old process still runs out its grace period (the
chart's Recreate strategy keeps them apart only during a rollout). The cluster lock of one
process does not reach the other; what keeps them from undoing each other's work is the order
of their reads and writes. Here the group sync of one process (laps_operator.reconcile.cycle, as the
pod handler calls it) runs against the Kubernetes API emulator while the other one's move lands
in the middle of it.

What a user would see without it: a prefill pod that the other operator just moved put back in
its old group for a moment (its EndpointSlices and the gateways following it there and back).
"""
from __future__ import annotations

import threading
import types

import kubernetes
import pytest

from laps_operator.naming import API_VERSION, GROUP, GROUP_LABEL, KIND, PLURAL, VERSION
from laps_operator.reconcile.cycle import reconcile, sync_groups_of
from laps_operator.reconcile.kube import Kube
from tests.e2e.operator.conftest import CRD
from tests.support.kube_gates import ApiGate
from tests.support.waiting import poll

NS = "default"
MERGE = "application/merge-patch+json"


@pytest.fixture
def kube(kube_api):
    kube_api.apply_crd(CRD)
    return types.SimpleNamespace(ops=Kube(kube_api.api_client()), custom=kubernetes.client.CustomObjectsApi(
        kube_api.api_client()), core=kubernetes.client.CoreV1Api(kube_api.api_client()))


def test_a_group_sync_never_puts_back_a_move_the_other_operator_made_meanwhile(kube_api, kube):
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, {
        "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "c", "namespace": NS},
        "spec": {"model": {"name": "m", "path": "/models/m.gguf"}, "prefill": {"replicas": 4},
                 "laps": {"allocation": {"enabled": True}}}})
    for i in range(4):   # the StatefulSet's pods (the emulator runs no StatefulSet controller)
        kube.core.create_namespaced_pod(NS, {
            "metadata": {"name": f"c-prefill-{i}", "labels": {"laps.io/cluster": "c", "laps.io/role": "prefill"}},
            "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    reconcile(kube.ops, NS, "c")   # both processes agree: 0 and 1 short, 2 and 3 long

    gate = ApiGate(kube_api, "list", "pods")
    sync = threading.Thread(target=sync_groups_of, args=(kube.ops, NS, "c"), name="the new process's sync")
    sync.start()
    poll(lambda: gate.held, message="the new process's group sync under way")
    # The old process moves c-prefill-1 to long meanwhile, as allocate.step does: status first, then the label.
    kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, "c", {"status": {
        "groups": {"short": ["c-prefill-0"], "long": ["c-prefill-1", "c-prefill-2", "c-prefill-3"]},
        "groupSizes": {"short": 1, "long": 3}}}, _content_type=MERGE)
    kube.core.patch_namespaced_pod("c-prefill-1", NS, {"metadata": {"labels": {GROUP_LABEL: "long"}}})
    gate.opened.set()
    sync.join(30)
    assert not sync.is_alive()

    labels = [(v["metadata"].get("labels") or {}).get(GROUP_LABEL)
              for v in kube_api.history("v1/pods", NS, "c-prefill-1")]
    assert [g for i, g in enumerate(labels) if g and g != labels[i - 1]] == ["short", "long"], labels
    status = kube.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "c")["status"]
    assert status["groups"] == {"short": ["c-prefill-0"], "long": ["c-prefill-1", "c-prefill-2", "c-prefill-3"]}
