"""Namespace users and LAPSClusters: after `helm install` of the chart, a user bound in their
namespace to Kubernetes' built-in `view`, `edit` or `admin` role reads (all three) and manages
(`edit`, `admin`) LAPSClusters there with kubectl: the chart's ClusterRoles carry the
aggregate-to-<role> labels and the real clusterrole-aggregation controller copies their rules into
the built-in roles. Status stays the operator's; the rights stay in the namespace bound."""
from __future__ import annotations

import json

from laps_operator.naming import CRD_NAME
from tests.cluster.story import REPO, Story, wait_for

EXAMPLE = str(REPO / "examples" / "lapscluster.yaml")


def test_users_of_the_built_in_roles_read_and_apply_lapsclusters_in_their_namespace(
        control_plane, cluster_namespace, programs):
    ns = cluster_namespace
    other = f"{ns[:40]}-other"
    control_plane.kubectl("create", "namespace", other)
    story = Story(control_plane, ns, *programs)
    story.install()
    try:
        users = {}
        for role in ("view", "edit", "admin"):
            control_plane.kubectl("create", "serviceaccount", f"user-{role}", "-n", ns)
            control_plane.kubectl("create", "rolebinding", f"user-{role}", "-n", ns, f"--clusterrole={role}",
                                  f"--serviceaccount={ns}:user-{role}")
            users[role] = control_plane.kubeconfig_for(ns, f"user-{role}")

        def kubectl(role: str, *args: str, stdin: str | None = None):
            return control_plane.kubectl(*args, kubeconfig=users[role], stdin=stdin, check=False)

        # The controller aggregates asynchronously: `edit` may create LAPSClusters once it has.
        wait_for(lambda: kubectl("edit", "auth", "can-i", "create", CRD_NAME, "-n", ns).stdout.strip()
                 == "yes", "the chart's rules aggregated into edit")

        refused = kubectl("view", "apply", "-n", ns, "-f", EXAMPLE)
        assert refused.returncode != 0 and "forbidden" in refused.stderr, refused.stderr
        assert kubectl("edit", "apply", "-n", ns, "-f", EXAMPLE).returncode == 0
        patched = kubectl("edit", "patch", "-n", ns, "laps", "smollm2", "--type", "merge",
                          "-p", json.dumps({"spec": {"prefill": {"replicas": 2}}}))
        assert patched.returncode == 0, patched.stderr
        for role in users:   # `kubectl get laps`, `kubectl describe laps`: everyone bound reads
            listed = kubectl(role, "get", "laps", "-n", ns, "-o", "json")
            assert listed.returncode == 0, listed.stderr
            assert [(c["metadata"]["name"], c["spec"]["prefill"]["replicas"])
                    for c in json.loads(listed.stdout)["items"]] == [("smollm2", 2)]
            assert kubectl(role, "describe", "laps", "smollm2", "-n", ns).returncode == 0
        for args in (("patch", "laps", "smollm2", "--type", "merge", "-p", '{"spec": {}}'),
                     ("delete", "laps", "smollm2")):
            denied = kubectl("view", *args, "-n", ns)
            assert denied.returncode != 0 and "forbidden" in denied.stderr, denied.stderr
        for role in ("edit", "admin"):   # status is the operator's
            denied = kubectl(role, "patch", "laps", "smollm2", "-n", ns, "--subresource=status", "--type", "merge",
                             "-p", '{"status": {"phase": "Ready"}}')
            assert denied.returncode != 0 and "forbidden" in denied.stderr, denied.stderr
        for args in (("get", "laps", "-n", other), ("apply", "-n", other, "-f", EXAMPLE)):
            denied = kubectl("edit", *args)
            assert denied.returncode != 0 and "forbidden" in denied.stderr, denied.stderr
        assert kubectl("admin", "delete", "laps", "smollm2", "-n", ns).returncode == 0
        assert "No resources found" in kubectl("view", "get", "laps", "-n", ns).stderr
    finally:
        story.uninstall()
        control_plane.kubectl("delete", "namespace", other, "--wait=false", check=False)
