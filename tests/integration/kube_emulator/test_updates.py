"""PATCH (three flavours), PUT, resourceVersion conflicts, the status subresource, generation."""
from __future__ import annotations

import kubernetes
import pytest
from kubernetes.client import ApiException

from tests.integration.kube_emulator.crd_samples import GROUP, PLURAL, VERSION, WIDGET, write_widget_crd


@pytest.fixture
def widgets(kube_api, tmp_path):
    kube_api.apply_crd(write_widget_crd(tmp_path))
    return kubernetes.client.CustomObjectsApi(kube_api.api_client())


def _statefulset(name: str, replicas: int = 1) -> dict:
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"replicas": replicas, "serviceName": name,
                 "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                     {"name": "engine", "image": "laps:1", "env": [{"name": "A", "value": "1"}]},
                     {"name": "sidecar", "image": "side:1"}]}}},
    }


def test_strategic_merge_merges_containers_by_name(apps):
    apps.create_namespaced_stateful_set("default", _statefulset("s"))
    patched = apps.patch_namespaced_stateful_set("s", "default", {"spec": {"template": {"spec": {
        "containers": [{"name": "engine", "image": "laps:2", "env": [{"name": "B", "value": "2"}]}]}}}})
    containers = {c.name: c for c in patched.spec.template.spec.containers}
    assert set(containers) == {"engine", "sidecar"}
    assert containers["engine"].image == "laps:2"
    # The API server's order (as a real one gives it): an item new to the list before the old ones.
    assert [e.name for e in containers["engine"].env] == ["B", "A"]


def test_pod_labels_patch_keeps_other_labels(core):
    core.create_namespaced_pod("default", {"metadata": {"name": "p", "labels": {"a": "1", "b": "2"}},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})
    patched = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"b": "3", "c": "4"}}})
    assert patched.metadata.labels == {"a": "1", "b": "3", "c": "4"}
    removed = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": None}}})
    assert removed.metadata.labels == {"b": "3", "c": "4"}


def test_strategic_merge_on_a_custom_resource_is_415(kube_api, widgets):
    widgets.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {**WIDGET, "metadata": {"name": "w"}})
    response = kube_api.http.patch(f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}/w",
                           json={"spec": {"size": 2}},
                           headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert response.status_code == 415


def test_merge_patch_replaces_lists_and_deletes_nulls(widgets):
    widgets.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
        **WIDGET, "metadata": {"name": "w"}, "spec": {"items": [1, 2], "drop": "me", "keep": True}})
    patched = widgets.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w",
                                                     {"spec": {"items": [3], "drop": None}})
    assert patched["spec"] == {"items": [3], "keep": True}


def test_failed_json_patch_test_is_422_and_changes_nothing(core):
    core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"k": "v"}})
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("c", "default", [
            {"op": "test", "path": "/data/k", "value": "other"},
            {"op": "replace", "path": "/data/k", "value": "changed"}])
    assert err.value.status == 422
    assert core.read_namespaced_config_map("c", "default").data == {"k": "v"}
    ok = core.patch_namespaced_config_map("c", "default", [
        {"op": "test", "path": "/data/k", "value": "v"},
        {"op": "replace", "path": "/data/k", "value": "changed"}])
    assert ok.data == {"k": "changed"}


def test_put_replaces_and_a_stale_resource_version_is_409(core):
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"a": "1"}})
    stale = created.metadata.resource_version
    replaced = core.replace_namespaced_config_map("c", "default", {
        "metadata": {"name": "c", "resourceVersion": stale}, "data": {"b": "2"}})
    assert replaced.data == {"b": "2"}
    assert replaced.metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("c", "default", {
            "metadata": {"name": "c", "resourceVersion": stale}, "data": {"c": "3"}})
    assert err.value.status == 409
    assert core.read_namespaced_config_map("c", "default").data == {"b": "2"}


def test_patch_with_a_stale_resource_version_is_409(core):
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"a": "1"}})
    core.patch_namespaced_config_map("c", "default", {"data": {"a": "2"}})
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("c", "default", {
            "metadata": {"resourceVersion": created.metadata.resource_version}, "data": {"a": "3"}})
    assert err.value.status == 409


def test_a_no_op_patch_keeps_the_resource_version(core):
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"a": "1"}})
    same = core.patch_namespaced_config_map("c", "default", {"data": {"a": "1"}})
    assert same.metadata.resource_version == created.metadata.resource_version


def test_status_patch_changes_only_status_and_bumps_no_generation(widgets):
    widgets.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
        **WIDGET, "metadata": {"name": "w"}, "spec": {"size": 1}, "status": {"ignored": "on create"}})
    created = widgets.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w")
    assert "status" not in created and created["metadata"]["generation"] == 1

    patched = widgets.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "w", {
        "spec": {"size": 99}, "metadata": {"labels": {"x": "y"}}, "status": {"ready": 1}})
    assert patched["status"] == {"ready": 1}
    assert patched["spec"] == {"size": 1} and not patched["metadata"].get("labels")
    assert patched["metadata"]["generation"] == 1


def test_main_endpoint_ignores_status_and_spec_changes_bump_generation(widgets):
    widgets.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {
        **WIDGET, "metadata": {"name": "w"}, "spec": {"size": 1}})
    widgets.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "w",
                                                  {"status": {"ready": 1}})
    patched = widgets.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w", {
        "spec": {"size": 2}, "status": {"ready": 0}})
    assert patched["spec"] == {"size": 2} and patched["status"] == {"ready": 1}
    assert patched["metadata"]["generation"] == 2
    labelled = widgets.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w", {
        "metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 2


def test_pod_status_is_written_through_the_status_subresource(core):
    core.create_namespaced_pod("default", {"metadata": {"name": "p"},
                                           "spec": {"containers": [{"name": "c", "image": "i"}]}})
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running", "podIP": "10.0.0.7"}})
    pod = core.read_namespaced_pod("p", "default")
    assert pod.status.phase == "Running" and pod.status.pod_ip == "10.0.0.7"


def test_server_side_apply_creates_then_updates(kube_api):
    # Field ownership is not emulated: an apply merges into the object (fields a manager stops
    # applying are kept, where the real server would remove them), so only that is asserted.
    url = f"{kube_api.url}/api/v1/namespaces/default/configmaps/applied?fieldManager=test"
    headers = {"Content-Type": "application/apply-patch+yaml"}
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: applied}}\ndata: {{a: '{}'}}\n"
    first = kube_api.http.patch(url, content=manifest.format(1), headers=headers)
    assert first.status_code == 201 and first.json()["data"] == {"a": "1"}
    second = kube_api.http.patch(url, content=manifest.format(2), headers=headers)
    assert second.status_code == 200 and second.json()["data"] == {"a": "2"}


def test_scale_subresource_reads_and_writes_replicas(apps):
    apps.create_namespaced_stateful_set("default", _statefulset("s", replicas=2))
    scale = apps.read_namespaced_stateful_set_scale("s", "default")
    assert scale.spec.replicas == 2 and scale.status.selector == "app=s"
    apps.patch_namespaced_stateful_set_scale("s", "default", {"spec": {"replicas": 4}})
    statefulset = apps.read_namespaced_stateful_set("s", "default")
    assert statefulset.spec.replicas == 4 and statefulset.metadata.generation == 2
    with pytest.raises(ApiException) as err:
        apps.replace_namespaced_stateful_set_scale("s", "default", {
            "metadata": {"name": "s", "resourceVersion": scale.metadata.resource_version},
            "spec": {"replicas": 1}})
    assert err.value.status == 409
