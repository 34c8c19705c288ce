"""Deleting a LAPSCluster never waits for the operator: it puts no finalizer on clusters, takes
the one an older operator left, and owner references let the garbage collector remove the
children (the API emulator runs that collector, as kube-controller-manager would)."""
from __future__ import annotations

import kubernetes

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_operator_e2e import GROUP, NS, PLURAL, VERSION, Cluster, example

OLD_FINALIZER = "laps.io/operator"


def gone(cluster: Cluster) -> bool:
    try:
        cluster.get()
    except kubernetes.client.ApiException as exc:
        return exc.status == 404
    return False


def test_clusters_carry_no_finalizer_and_delete_while_the_operator_is_down(kube_api, start_operator):
    # A cluster from the days of the finalizer: an older operator put it there.
    old = Cluster(kube_api, "old")
    body = example("old")
    body["metadata"]["finalizers"] = [OLD_FINALIZER]
    old.create(body)
    operator = start_operator()
    wait_for(lambda: not old.get()["metadata"].get("finalizers"), "the old finalizer removed")

    new = Cluster(kube_api, "new")
    new.create(example("new"))
    wait_for(new.statefulset, "the new cluster's StatefulSet")
    wait_for(lambda: new.get()["metadata"].get("annotations", {}).get("laps.io/last-handled-configuration"),
             "the operator to have handled the new cluster")
    assert not new.get()["metadata"].get("finalizers")
    wait_for(old.statefulset, "the old cluster's StatefulSet")

    # The operator is gone (a failed upgrade, an uninstalled chart): deletion still completes.
    operator.stop()
    for cluster in (old, new):
        cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, cluster.name)
        assert gone(cluster)   # at once: nothing holds it
    wait_for(lambda: not old.apps.list_namespaced_stateful_set(NS).items, "the children garbage-collected")
    assert not old.services() and not new.services()
