"""The user's story, for real: `helm install laps charts/laps`, `kubectl apply -f
examples/lapscluster.yaml`, and what follows, on a real API server with the real controllers
(tests/cluster/story.py says what each step shows and what this tier cannot show).

Least privilege is proven by the real RBAC authoriser: the operator runs with the token of the
chart's ServiceAccount, the gateway with that of the ServiceAccount the operator made for it, and
any 403 either gets fails the step it happened in."""
from __future__ import annotations

from tests.cluster.story import OPERATOR_USER, RELEASE_NS, STORY, Story, chart_rules, triples

# Checked by the API server on the operator's behalf, never (or not always) requested: the
# OwnerReferencesPermissionEnforcement admission plugin's `delete` on every child whose owner
# references it sets and `update` on the clusters' finalizers (blockOwnerDeletion); RBAC's
# escalation prevention, when it creates the gateway's Role, what that Role grants.
CHILD_KINDS = [("", "configmaps"), ("", "serviceaccounts"), ("", "services"), ("apps", "deployments"),
               ("apps", "statefulsets"), ("rbac.authorization.k8s.io", "roles"),
               ("rbac.authorization.k8s.io", "rolebindings"), ("networking.k8s.io", "networkpolicies"),
               ("monitoring.coreos.com", "podmonitors")]
INDIRECT = {("laps.io", "lapsclusters/finalizers", "update"),
            ("discovery.k8s.io", "endpointslices", "list"), ("discovery.k8s.io", "endpointslices", "watch"),
            *((group, kind, "delete") for group, kind in CHILD_KINDS)}
# Used when the story's pods are slow to come up: the Ready condition reads their workload's
# Events to say why (the emulator tier's test_pod_problems_e2e.py shows it).
SITUATIONAL = {("", "events", "list")}


def test_helm_install_kubectl_apply_serve_move_edit_and_delete(control_plane, cluster_namespace, programs):
    story = Story(control_plane, cluster_namespace, *programs)
    story.install()
    try:
        # The CRD is served at once, with its short name: no LAPSCluster yet.
        assert "No resources found" in control_plane.kubectl("get", "laps", "-n", cluster_namespace).stderr
        story.run([getattr(story, step) for step in STORY])
        assert story.steps_done == STORY
        header = story.table.splitlines()[0].split()
        assert header == ["NAME", "PHASE", "SHORT", "LONG", "AGE"], story.table
        assert story.table.splitlines()[1].split()[2:4] == ["1", "1"], story.table
        # The chart grants what the operator asked for, and what the API server checks on its
        # behalf (test_least_privilege.py shows that each rule is needed).
        granted, used = triples(chart_rules()), story.used(OPERATOR_USER)
        print(f"{OPERATOR_USER} used:", *sorted(used), sep="\n  ")
        assert not used - granted
        assert granted - used <= INDIRECT | SITUATIONAL, sorted(granted - used - INDIRECT - SITUATIONAL)
        # The gateway asked for exactly what the Role the operator makes for it grants.
        assert story.used(story.gateway_user) == triples(_gateway_role()["rules"])
    finally:
        story.uninstall()
    assert not control_plane.kubectl_json("get", "deployments", "-n", RELEASE_NS)["items"]


def _gateway_role() -> dict:
    from laps_operator.naming import ClusterRef
    from laps_operator.render.builders import build_gateway_rbac
    from laps_operator.spec.cluster import parse_spec

    _, role, _ = build_gateway_rbac(ClusterRef("c", "ns", "uid"), parse_spec({"model": {"name": "m", "path": "/m"}}))
    return role
