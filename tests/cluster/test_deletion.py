"""Deleting a LAPSCluster never waits for the operator: it puts no finalizer on clusters and takes
off the one an older operator left; with the operator down, `kubectl delete` completes at once and
the real garbage collector removes the children by their owner references."""
from __future__ import annotations

import json

import yaml

from tests.cluster.story import RELEASE, RELEASE_NS, REPO, Story, wait_for

OLD_FINALIZER = "laps.io/operator"


def test_clusters_carry_no_finalizer_and_delete_while_the_operator_is_down(control_plane, cluster_namespace, programs):
    ns = cluster_namespace
    story = Story(control_plane, ns, *programs)
    story.install()
    try:
        def apply(name: str, finalizers: list[str] | None = None) -> None:
            doc = yaml.safe_load((REPO / "examples" / "lapscluster-minimal.yaml").read_text())
            doc["metadata"].update(name=name, **({"finalizers": finalizers} if finalizers else {}))
            control_plane.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(doc))

        def get(name: str) -> dict | None:
            return control_plane.kubectl_json("get", "laps", name, "-n", ns, check=False)

        apply("old", [OLD_FINALIZER])   # from the days of the finalizer: an older operator put it there
        operator = programs[0](control_plane.kubeconfig_for(RELEASE_NS, RELEASE))
        wait_for(lambda: not get("old")["metadata"].get("finalizers"), "the old finalizer removed")
        apply("new")
        wait_for(lambda: control_plane.kubectl_json("get", "statefulset", "new-prefill", "-n", ns, check=False),
                 "the new cluster's StatefulSet")
        wait_for(lambda: get("new")["metadata"].get("annotations", {}).get("laps.io/last-handled-configuration"),
                 "the operator to have handled the new cluster")
        assert not get("new")["metadata"].get("finalizers")

        operator.stop()   # a failed upgrade, an uninstalled chart: deletion still completes
        control_plane.kubectl("delete", "laps", "old", "new", "-n", ns, "--timeout=10s")
        assert get("old") is None and get("new") is None
        wait_for(lambda: not control_plane.kubectl_json(
            "get", "statefulsets,deployments,services,pods", "-n", ns, "-l", "laps.io/cluster")["items"],
            # The collector learns of a new kind (the CRD) at its next discovery, every 30 s.
            "the children garbage-collected", timeout=90)
    finally:
        story.uninstall()
