"""apply_all: an edit is applied whole or not at all, as far as the API server can say beforehand."""
from __future__ import annotations

import pytest

from laps_operator.reconcile.apply_writes import ChildRefused, apply_all
from laps_operator.reconcile.kube import KubeError, Ref
from tests.unit.operator.fake_kube import FakeKube


def config_map(name: str, value: str = "1") -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns"},
            "data": {"k": value}}


POD_MONITOR = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
               "metadata": {"name": "x-engines", "namespace": "ns"}, "spec": {}}
ROLE = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "x-gw", "namespace": "ns"},
        "rules": []}
BINDING = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": "x-gw", "namespace": "ns"}, "roleRef": {"kind": "Role", "name": "x-gw"},
           "subjects": []}


def test_a_cluster_without_the_podmonitor_api_gets_every_other_child_and_says_skipped():
    kube = FakeKube()
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(404, "the server could not find the requested resource") if ref.kind == "PodMonitor" else None)
    results = apply_all(kube, [config_map("a"), POD_MONITOR, config_map("b")], frozenset({"PodMonitor"}))
    assert [(r.ref.name, r.action) for r in results] == [("x-engines", "skipped"), ("a", "created"), ("b", "created")]
    assert "PodMonitor API not available" in results[0].detail
    # The same when the kind disappears between the dry run and the write (a CRD removed).
    kube = FakeKube()
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(404, "not found") if ref.kind == "PodMonitor" and not dry else None)
    results = apply_all(kube, [POD_MONITOR, config_map("a")], frozenset({"PodMonitor"}))
    assert {(r.ref.name, r.action) for r in results} == {("x-engines", "skipped"), ("a", "created")}
    # A kind that is not optional is an error.
    with pytest.raises(KubeError):
        apply_all(kube, [POD_MONITOR])


def test_a_refused_new_child_leaves_every_other_child_as_it_was():
    kube = FakeKube()
    apply_all(kube, [config_map("a", "old")])
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(403, 'admission webhook "policy.example" denied the request: no') if ref.name == "new" else None)
    with pytest.raises(ChildRefused) as refused:
        apply_all(kube, [config_map("a", "new"), config_map("new")])
    assert kube.get(Ref("v1", "ConfigMap", "ns", "a"))["data"] == {"k": "old"}   # not half applied
    assert kube.get(Ref("v1", "ConfigMap", "ns", "new")) is None
    assert "ConfigMap/new" in str(refused.value) and "no child was changed" in str(refused.value)
    # A ValidatingAdmissionPolicy says it in other words; RBAC's own 403 is not a refusal of the object.
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(403, "ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no") if ref.name == "new" else None)
    with pytest.raises(ChildRefused):
        apply_all(kube, [config_map("new")])
    kube.refuse = lambda verb, ref, body, dry: KubeError(403, 'configmaps is forbidden: User "op" cannot create')
    with pytest.raises(KubeError) as forbidden:
        apply_all(kube, [config_map("new")])
    assert not isinstance(forbidden.value, ChildRefused)


def test_a_binding_of_a_role_new_in_the_same_edit_is_created_after_it_without_a_dry_run():
    kube = FakeKube()
    # RBAC's escalation check refuses a binding of a Role that does not exist (yet).
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(422, "roles.rbac.authorization.k8s.io \"x-gw\" not found")
        if ref.kind == "RoleBinding" and kube.get(Ref.of(ROLE)) is None else None)
    results = apply_all(kube, [ROLE, BINDING])
    assert [(r.ref.kind, r.action) for r in results] == [("Role", "created"), ("RoleBinding", "created")]
    assert ("create", Ref.of(ROLE)) in kube.dry_runs and ("create", Ref.of(BINDING)) not in kube.dry_runs


def test_an_immutable_field_says_how_to_let_the_operator_recreate_the_child():
    kube = FakeKube()
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "x-prefill", "namespace": "ns"},
           "spec": {"selector": {"matchLabels": {"a": "1"}}}}
    apply_all(kube, [sts])
    kube.refuse = lambda verb, ref, body, dry: KubeError(
        422, 'StatefulSet.apps "x-prefill" is invalid: spec: Forbidden: updates to statefulset spec for fields other '
             'than ... are forbidden; spec.selector: field is immutable')
    with pytest.raises(ChildRefused) as refused:
        apply_all(kube, [{**sts, "spec": {"selector": {"matchLabels": {"a": "2"}}}}])
    assert refused.value.immutable and "--cascade=orphan" in str(refused.value)


def test_a_refused_repair_is_reported_and_holds_back_no_other_write():
    """The child renders as last applied and someone edited it: putting it back is a repair,
    and its refusal (a policy added since) is not the edit's: the other writes go on."""
    kube = FakeKube()
    apply_all(kube, [config_map("a"), config_map("b")])
    kube.objects[("ConfigMap", "ns", "a")]["data"] = {"k": "by hand"}
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(403, 'admission webhook "p" denied the request: frozen') if ref.name == "a" else None)
    results = apply_all(kube, [config_map("a"), config_map("b", "2"), config_map("c")])
    assert [(r.ref.name, r.action) for r in results] == [("a", "refused"), ("b", "patched"), ("c", "created")]
    assert results[0].detail.startswith("the API server refuses to bring ConfigMap/a back to the spec")
    assert kube.get(Ref("v1", "ConfigMap", "ns", "a"))["data"] == {"k": "by hand"}
    # A change of the refused child itself is the edit's: all or nothing again.
    with pytest.raises(ChildRefused):
        apply_all(kube, [config_map("a", "3"), config_map("b", "4")])
    assert kube.get(Ref("v1", "ConfigMap", "ns", "b"))["data"] == {"k": "2"}
    # Unless the spec was applied before (an operator upgrade's new rendering, at a resync).
    results = apply_all(kube, [config_map("a", "3"), config_map("b", "4")], applied=True)
    assert [(r.ref.name, r.action) for r in results] == [("a", "refused"), ("b", "patched")]


def test_what_a_dry_run_cannot_tell_is_left_to_the_write():
    # A webhook with side effects answers every dry run so (k8s.io/apiserver's admission
    # dispatcher); the object itself is not refused: the real write decides.
    kube = FakeKube()
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(400, 'admission webhook "audit.example.com" does not support dry run') if dry else None)
    assert [r.action for r in apply_all(kube, [config_map("a"), config_map("b")])] == ["created", "created"]
    # Created by another writer between the read and the dry run: the write patches it.
    kube = FakeKube()
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(409, 'configmaps "a" already exists') if dry and verb == "create" else None)
    assert [r.action for r in apply_all(kube, [config_map("a")])] == ["created"]


def test_a_repair_refused_only_by_the_real_write_is_reported_and_the_rest_goes_on():
    kube = FakeKube()
    apply_all(kube, [config_map("a"), config_map("b")])
    kube.objects[("ConfigMap", "ns", "a")]["data"] = {"k": "by hand"}
    kube.objects[("ConfigMap", "ns", "b")]["data"] = {"k": "by hand"}
    kube.refuse = lambda verb, ref, body, dry: (
        KubeError(422, "quota webhook: over budget") if ref.name == "a" and not dry else None)
    results = apply_all(kube, [config_map("a"), config_map("b")])
    assert [(r.ref.name, r.action) for r in results] == [("a", "refused"), ("b", "patched")]
    assert "(left as it is, the other children applied)" in results[0].detail
