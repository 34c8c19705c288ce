"""Deletion: finalizers, preconditions, and the garbage collector's ownerReference cascade."""
from __future__ import annotations

import kubernetes
import pytest
from kubernetes.client import ApiException


def _exists(read, *args) -> bool:
    try:
        read(*args)
    except ApiException as exc:
        assert exc.status == 404
        return False
    return True


def _owned_by(owner, name: str, labels: dict | None = None) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}, "ownerReferences": [{
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": owner.metadata.name,
        "uid": owner.metadata.uid, "controller": True}]},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}


def _statefulset(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "serviceName": name, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "c", "image": "i"}]}}}}


def test_finalizers_hold_an_object_until_removed(core):
    core.create_namespaced_config_map("default", {"metadata": {"name": "c", "finalizers": ["x/y"]}})
    core.delete_namespaced_config_map("c", "default")
    held = core.read_namespaced_config_map("c", "default")
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("c", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    assert not _exists(core.read_namespaced_config_map, "c", "default")


def test_deleting_an_owner_deletes_its_dependents(core, apps):
    owner = apps.create_namespaced_stateful_set("default", _statefulset("s"))
    for i in range(2):
        core.create_namespaced_pod("default", _owned_by(owner, f"s-{i}"))
    core.create_namespaced_pod("default", {"metadata": {"name": "bystander"},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})
    apps.delete_namespaced_stateful_set("s", "default")
    remaining = [p.metadata.name for p in core.list_namespaced_pod("default").items]
    assert remaining == ["bystander"]


def test_cascade_goes_through_several_levels(core, apps):
    owner = apps.create_namespaced_stateful_set("default", _statefulset("s"))
    pod = core.create_namespaced_pod("default", _owned_by(owner, "s-0"))
    core.create_namespaced_config_map("default", {"metadata": {"name": "grandchild", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Pod", "name": "s-0", "uid": pod.metadata.uid}]}})
    apps.delete_namespaced_stateful_set("s", "default")
    assert not _exists(core.read_namespaced_config_map, "grandchild", "default")


def test_orphan_propagation_keeps_dependents_without_the_reference(core, apps):
    owner = apps.create_namespaced_stateful_set("default", _statefulset("s"))
    core.create_namespaced_pod("default", _owned_by(owner, "s-0"))
    apps.delete_namespaced_stateful_set("s", "default", propagation_policy="Orphan")
    pod = core.read_namespaced_pod("s-0", "default")
    assert not pod.metadata.owner_references


def test_a_dependent_with_another_live_owner_survives(core, apps):
    first = apps.create_namespaced_stateful_set("default", _statefulset("a"))
    second = apps.create_namespaced_stateful_set("default", _statefulset("b"))
    body = _owned_by(first, "shared")
    body["metadata"]["ownerReferences"].append({"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                "name": "b", "uid": second.metadata.uid})
    core.create_namespaced_pod("default", body)
    apps.delete_namespaced_stateful_set("a", "default")
    refs = core.read_namespaced_pod("shared", "default").metadata.owner_references
    assert [r.name for r in refs] == ["b"]


def test_dependents_with_finalizers_are_marked_not_removed(core, apps):
    owner = apps.create_namespaced_stateful_set("default", _statefulset("s"))
    body = _owned_by(owner, "s-0")
    body["metadata"]["finalizers"] = ["example.com/keep"]
    core.create_namespaced_pod("default", body)
    apps.delete_namespaced_stateful_set("s", "default")
    assert core.read_namespaced_pod("s-0", "default").metadata.deletion_timestamp is not None


def test_delete_with_a_stale_precondition_is_409(core):
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "c"}})
    core.patch_namespaced_config_map("c", "default", {"data": {"a": "1"}})
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_config_map("c", "default", body=kubernetes.client.V1DeleteOptions(
            preconditions=kubernetes.client.V1Preconditions(
                resource_version=created.metadata.resource_version)))
    assert err.value.status == 409
    assert _exists(core.read_namespaced_config_map, "c", "default")


def test_delete_collection_by_label(core):
    for name, role in (("a", "prefill"), ("b", "prefill"), ("c", "decode")):
        core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": {"role": role}}})
    core.delete_collection_namespaced_config_map("default", label_selector="role=prefill")
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["c"]


def test_deleting_a_missing_object_is_404(core):
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_config_map("nope", "default")
    assert err.value.status == 404


def test_no_new_finalizers_on_an_object_being_deleted(core):
    core.create_namespaced_config_map("default", {"metadata": {"name": "c", "finalizers": ["a/b"]}})
    core.delete_namespaced_config_map("c", "default")
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("c", "default", {"metadata": {"finalizers": ["a/b", "c/d"]}})
    assert err.value.status == 422


@pytest.mark.parametrize("create, delete, body", [
    ("create_namespaced_service", "delete_namespaced_service", {"spec": {"ports": [{"port": 80}]}}),
    ("create_namespaced_service_account", "delete_namespaced_service_account", {}),
    ("create_namespaced_pod", "delete_namespaced_pod",
     {"spec": {"containers": [{"name": "c", "image": "i"}]}}),
    ("create_namespaced_config_map", "delete_namespaced_config_map", {}),
], ids=lambda v: v if isinstance(v, str) and v.startswith("create") else "")
def test_typed_deletes_of_the_operators_kinds(core, create, delete, body):
    getattr(core, create)("default", {"metadata": {"name": "x"}, **body})
    getattr(core, delete)("x", "default")  # the client deserializes what the server answers
    assert not _exists(getattr(core, delete.replace("delete", "read")), "x", "default")
