"""Status conditions and the create-or-patch decisions, without a server."""
from __future__ import annotations

from laps_operator.reconcile.apply import contains, three_way_patch
from laps_operator.reconcile.cycle import cluster_ref, delete_children, reconcile, refresh_cluster
from laps_operator.reconcile.writers import cr_ref
from laps_operator.render.builders import build_children
from laps_operator.spec.cluster import InvalidSpecError, parse_spec
from laps_operator.status.conditions import (
    condition,
    groups_status,
    invalid_status,
    reconciled_status,
    set_condition,
    workload_readiness,
)
from tests.unit.operator.fake_kube import FakeKube, cluster

SPEC = parse_spec({"model": {"name": "m", "path": "/m"}, "prefill": {"replicas": 2}})


def ready(n, *, updated=None, replicas=None, generation=1, observed=1):
    """A workload's status as its controller writes it (every replica on the current template
    unless `updated` says fewer)."""
    updated = n if updated is None else updated
    return {"metadata": {"generation": generation},
            "status": {"observedGeneration": observed, "replicas": n if replicas is None else replicas,
                       "readyReplicas": n, "updatedReplicas": updated}}


def test_ready_only_when_every_workload_has_its_replicas():
    assert workload_readiness(SPEC, ready(2), ready(1), ready(1)).ready
    waiting = workload_readiness(SPEC, ready(1), ready(1), None)
    assert not waiting.ready
    assert "prefill 1/2" in waiting.message and "gateway 0/1" in waiting.message


def test_reconciled_status_sets_phase_and_conditions():
    status = reconciled_status(None, generation=4, readiness=workload_readiness(SPEC, ready(2), ready(1), ready(1)),
                               now="2026-01-01T00:00:00Z")
    assert status["phase"] == "Ready" and status["observedGeneration"] == 4
    assert condition(status["conditions"], "Ready")["status"] == "True"
    assert condition(status["conditions"], "Progressing")["status"] == "False"
    assert condition(status["conditions"], "InvalidSpec")["status"] == "False"
    assert "groups" not in status  # written only by the group sync


def test_an_edit_rolling_out_behind_ready_old_pods_is_progressing_until_every_pod_is_updated():
    """After a spec edit (image, model, threshold) the old pods stay ready while the new ones
    start; a Deployment surges, so readyReplicas never drops. The cluster still serves (Ready),
    but it does not yet serve what the spec asks for: Progressing names the workload."""
    stages = [
        (ready(2, generation=2, observed=1), "prefill update not yet seen by its controller"),
        (ready(2, updated=1), "prefill 1/2 updated"),
        (ready(2, replicas=3), "prefill 1 old pods still running"),
    ]
    for prefill, says in stages:
        readiness = workload_readiness(SPEC, prefill, ready(1), ready(1))
        status = reconciled_status(None, generation=2, readiness=readiness, now="t")
        assert status["phase"] == "Progressing"
        assert condition(status["conditions"], "Ready")["status"] == "True"
        progressing = condition(status["conditions"], "Progressing")
        assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
        assert says in progressing["message"]
    # A gateway whose new pod never becomes ready (bad image): its old pod still serves.
    stuck = workload_readiness(SPEC, ready(2), ready(1), ready(1, updated=0, replicas=2))
    status = reconciled_status(None, generation=2, readiness=stuck, now="t")
    assert status["phase"] == "Progressing" and "gateway 0/1 updated" in stuck.rollout
    done = reconciled_status(status, generation=2, readiness=workload_readiness(SPEC, ready(2), ready(1), ready(1)),
                             now="t")
    assert done["phase"] == "Ready" and condition(done["conditions"], "Progressing")["status"] == "False"


def test_groups_status_lists_members_and_sizes():
    assert groups_status({"short": ["p-0"], "long": ["p-1", "p-2"]}) == {
        "groups": {"short": ["p-0"], "long": ["p-1", "p-2"]}, "groupSizes": {"short": 1, "long": 2}}


def test_transition_time_moves_only_when_status_flips():
    first = set_condition(None, "Ready", False, "NotReady", "x", generation=1, now="t1")
    same = set_condition(first, "Ready", False, "NotReady", "y", generation=2, now="t2")
    flipped = set_condition(same, "Ready", True, "AllReplicasReady", "z", generation=2, now="t3")
    assert condition(same, "Ready")["lastTransitionTime"] == "t1"
    assert condition(same, "Ready")["message"] == "y"
    assert condition(flipped, "Ready")["lastTransitionTime"] == "t3"


def test_invalid_status_names_the_reason():
    try:
        parse_spec({"model": {"name": "m", "path": "/m"}, "engine": {"backend": "vllm"}})
    except InvalidSpecError as exc:
        message = str(exc)
    assert message.startswith("spec.engine.backend:") and "builtin" in message
    status = invalid_status(None, generation=2, message=message, now="t")
    assert status["phase"] == "Invalid"
    invalid = condition(status["conditions"], "InvalidSpec")
    assert (invalid["status"], invalid["reason"], invalid["message"]) == ("True", "InvalidSpec", message)
    assert condition(status["conditions"], "Ready")["status"] == "False"


def test_spec_error_lists_every_bad_field():
    try:
        parse_spec({"model": {"name": ""}, "prefill": {"replicas": 0}, "bogus": 1})
    except InvalidSpecError as exc:
        message = str(exc)
    for where in ("spec.model.name", "spec.model.path", "spec.prefill.replicas", "spec.bogus"):
        assert where in message


def test_unchanged_live_object_needs_no_patch_despite_server_fields():
    desired = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "labels": {"a": "1"}},
               "spec": {"ports": [{"name": "http", "port": 80}], "selector": {"x": "y"}}}
    live = {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "s", "labels": {"a": "1", "extra": "kept"}, "uid": "u", "resourceVersion": "7"},
            "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}], "selector": {"x": "y"},
                     "clusterIP": "10.0.0.1"},
            "status": {}}
    assert contains(live, desired)
    assert three_way_patch(None, desired, live) == {}


def test_changed_spec_is_patched_in_place_only_where_it_differs():
    desired = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "labels": {"a": "1"}},
               "spec": {"replicas": 6, "template": {"spec": {"containers": [{"name": "e", "args": ["--x", "2"]}]}}}}
    live = {"metadata": {"name": "s", "labels": {"a": "1"}, "uid": "u"},
            "spec": {"replicas": 4, "template": {"spec": {"containers": [{"name": "e", "args": ["--x", "1"]}]}}}}
    assert three_way_patch(None, desired, live) == {"spec": desired["spec"]}


def test_quantities_stored_as_strings_count_as_equal():
    assert contains({"limits": {"nvidia.com/gpu": "2", "memory": "8Gi"}}, {"limits": {"nvidia.com/gpu": 2}})
    assert not contains({"replicas": 3}, {"replicas": 4})
    assert contains({"ratio": 2}, {"ratio": 2.0})
    assert not contains({"enabled": "True"}, {"enabled": True})


def test_api_paths_of_core_grouped_and_custom_kinds():
    from laps_operator.reconcile.kube import Ref

    assert Ref("v1", "Pod", "ns", "p-0").path() == "/api/v1/namespaces/ns/pods/p-0"
    assert Ref("apps/v1", "StatefulSet", "ns").path() == "/apis/apps/v1/namespaces/ns/statefulsets"
    cr = Ref.of({"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster", "metadata": {"name": "c", "namespace": "ns"}})
    assert cr.path() == "/apis/laps.io/v1alpha1/namespaces/ns/lapsclusters/c"
    assert cr.collection().path() == "/apis/laps.io/v1alpha1/namespaces/ns/lapsclusters"


def test_a_cluster_whose_name_its_children_cannot_carry_is_invalid_and_gets_none():
    # The CRD refuses such names; a server that did not (an old CRD) gets the same answer from
    # the operator instead of children the API server would refuse one by one.
    kube = FakeKube()
    for name, says in (("c" * 45, "at most 44"), ("my.cluster", "DNS-1035")):
        kube.add(cluster(name))
        outcome = reconcile(kube, "ns", name)
        assert outcome.phase == "Invalid" and outcome.invalid.startswith("metadata.name:")
        status = kube.get(cr_ref("ns", name))["status"]
        assert status["phase"] == "Invalid"
        assert says in condition(status["conditions"], "InvalidSpec")["message"]
    assert [verb for verb, _, _ in kube.writes if verb != "patch/status"] == []


def test_deleting_a_cluster_removes_every_kind_of_child_it_can_own():
    # Owner references let the garbage collector do it; the delete handler does it as well, so
    # it must know every child the builders make (NetworkPolicies and the PodMonitor included).
    kube = FakeKube()
    body = kube.add(cluster("c", replicas=2))
    ref = cluster_ref(body)
    children = build_children(ref, parse_spec({**body["spec"], "monitoring": {"podMonitor": True}}), "ops")
    for child in children:
        kube.add(child)
    removed = {(a.ref.kind, a.ref.name) for a in delete_children(kube, ref)}
    assert removed == {(c["kind"], c["metadata"]["name"]) for c in children}
    assert {key for key in kube.objects if key[0] != "LAPSCluster"} == set()


def test_a_status_refresh_finding_its_cluster_recreated_meanwhile_writes_nothing_into_the_new_one():
    """`kubectl delete` then `apply` of a namesake while a refresh of the old one lists its pods:
    the old one's readiness must not land in the new one's status (nor a Phase event say "")."""
    kube = FakeKube()
    kube.add(cluster())   # uid-1, no workloads yet: not ready, so the refresh lists its pods

    class Recreating(FakeKube):
        def list(self, ref, label_selector=None):
            if ref.kind == "Pod":
                kube.objects.pop(("LAPSCluster", "ns", "c"))
                kube.add({**cluster(), "metadata": {**cluster()["metadata"], "uid": "uid-2"}})
            return kube.list(ref, label_selector)

    racing = Recreating()
    racing.objects, racing.get, racing.patch = kube.objects, kube.get, kube.patch
    assert refresh_cluster(racing, "ns", "c", uid="uid-1") == ("", "")
    assert kube.get(cr_ref("ns", "c"))["metadata"]["uid"] == "uid-2"
    assert kube.get(cr_ref("ns", "c"))["status"] == {}   # nothing of uid-1's written into it


def test_a_refused_repair_keeps_the_cluster_serving_and_holds_back_neither_repairs_nor_edits():
    """A policy added after the cluster was applied refuses the repair of a hand edit (or an
    upgraded operator's new rendering): the spec is not what is wrong, so the cluster is not
    marked Invalid (which would stop its group sync and allocation), the other children are
    still repaired, and an edit that does not touch the refused child is applied."""
    from laps_operator.reconcile.kube import KubeError, Ref

    kube = FakeKube()
    kube.add(cluster(replicas=2))
    assert reconcile(kube, "ns", "c").phase != "Invalid"
    gateway, decode = Ref("apps/v1", "Deployment", "ns", "c-gateway"), Ref("apps/v1", "Deployment", "ns", "c-decode")
    kube.objects[("Deployment", "ns", "c-gateway")]["spec"]["replicas"] = 9   # hand edits the resync puts back
    kube.objects[("Deployment", "ns", "c-decode")]["spec"]["replicas"] = 5
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(403, 'admission webhook "p" denied the request: replicas are frozen') if ref == gateway else None)
    outcome = reconcile(kube, "ns", "c", skip_invalid=True)
    assert outcome.refused.startswith("the API server refuses to bring Deployment/c-gateway back to the spec")
    assert outcome.invalid is None
    status = kube.get(cr_ref("ns", "c"))["status"]
    assert status["phase"] != "Invalid" and condition(status["conditions"], "InvalidSpec")["status"] == "False"
    assert kube.get(gateway)["spec"]["replicas"] == 9 and kube.get(decode)["spec"]["replicas"] == 1
    # An edit of another child (decode replicas) lands beside the refused repair.
    live = kube.objects[("LAPSCluster", "ns", "c")]
    live["spec"]["decode"] = {**(live["spec"].get("decode") or {}), "replicas": 3}
    live["metadata"]["generation"] = 2
    outcome = reconcile(kube, "ns", "c")
    assert outcome.invalid is None and outcome.refused and kube.get(cr_ref("ns", "c"))["status"]["observedGeneration"] == 2
    assert kube.get(decode)["spec"]["replicas"] == 3 and kube.get(gateway)["spec"]["replicas"] == 9
    # Allowed again: the next resync repairs it.
    kube.refuse = lambda verb, ref, body, dry: None
    outcome = reconcile(kube, "ns", "c", skip_invalid=True)
    assert outcome.refused is None and kube.get(gateway)["spec"]["replicas"] == 1


def test_the_resync_retries_a_spec_the_api_server_refused_but_not_one_its_checks_refused():
    from laps_operator.reconcile.kube import KubeError

    kube = FakeKube()
    kube.add(cluster(replicas=2))
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(422, 'Service "c-gateway" is invalid: spec.ports') if ref.kind == "Service" else None)
    outcome = reconcile(kube, "ns", "c")
    invalid = condition(kube.get(cr_ref("ns", "c"))["status"]["conditions"], "InvalidSpec")
    assert outcome.phase == "Invalid" and invalid["reason"] == "ChildRefused"
    assert [verb for verb, _, _ in kube.writes if verb != "patch/status"] == []   # no child, not one
    kube.refuse = lambda verb, ref, body, dry: None
    assert reconcile(kube, "ns", "c", skip_invalid=True).phase != "Invalid"   # the resync tried again
    # A spec the operator's own checks refuse waits for the next edit: the resync writes nothing.
    live = kube.objects[("LAPSCluster", "ns", "c")]
    live["spec"]["prefill"]["replicas"], live["metadata"]["generation"] = -1, 2
    assert reconcile(kube, "ns", "c").phase == "Invalid"
    writes = len(kube.writes)
    assert reconcile(kube, "ns", "c", skip_invalid=True).phase == "Invalid" and len(kube.writes) == writes
