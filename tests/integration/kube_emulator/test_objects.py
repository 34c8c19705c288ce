"""Create/read/list through the official client, checked against kube-apiserver behaviour."""
from __future__ import annotations

import datetime

import kubernetes
import pytest
from kubernetes.client import ApiException


def _config_map(name: str, labels: dict | None = None, **extra) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}, **extra}, "data": {"k": "v"}}


def test_create_answers_201_and_sets_server_fields(kube_api):
    response = kube_api.http.post("/api/v1/namespaces/ns1/configmaps",
                          json={"metadata": {"name": "c"}, "data": {"k": "v"}})
    assert response.status_code == 201
    meta = response.json()["metadata"]
    assert meta["namespace"] == "ns1"
    assert meta["uid"] and meta["resourceVersion"].isdigit() and meta["generation"] == 1
    created = datetime.datetime.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    assert abs(now - created) < datetime.timedelta(minutes=5)
    assert response.json()["kind"] == "ConfigMap" and response.json()["apiVersion"] == "v1"


def test_custom_object_create_returns_the_object(kube_api, tmp_path):
    from tests.integration.kube_emulator.crd_samples import GROUP, PLURAL, VERSION, WIDGET, write_widget_crd
    kube_api.apply_crd(write_widget_crd(tmp_path))
    objects = kubernetes.client.CustomObjectsApi(kube_api.api_client())
    created = objects.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, {**WIDGET, "metadata": {"name": "w"}, "spec": {"size": 1}})
    assert created["metadata"]["name"] == "w" and created["kind"] == "Widget"


def test_every_write_gets_a_newer_resource_version(core):
    first = core.create_namespaced_config_map("default", _config_map("a"))
    second = core.create_namespaced_config_map("default", _config_map("b"))
    patched = core.patch_namespaced_config_map("a", "default", {"data": {"k": "w"}})
    versions = [int(o.metadata.resource_version) for o in (first, second, patched)]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert core.list_namespaced_config_map("default").metadata.resource_version == str(versions[-1])


def test_generate_name_makes_unique_names(core):
    names = {core.create_namespaced_config_map("default", {"metadata": {"generateName": "gen-"}})
             .metadata.name for _ in range(5)}
    assert len(names) == 5 and all(n.startswith("gen-") and len(n) == 9 for n in names)


def test_duplicate_create_is_409_already_exists(core):
    core.create_namespaced_config_map("default", _config_map("dup"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", _config_map("dup"))
    assert err.value.status == 409 and "already exists" in err.value.body


def test_missing_object_is_404_and_namespaces_isolate(core):
    core.create_namespaced_config_map("ns-a", _config_map("only-here"))
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("only-here", "ns-b")
    assert err.value.status == 404 and "not found" in err.value.body


def test_lists_carry_kind_and_filter_by_label_selector(kube_api, core):
    core.create_namespaced_pod("default", _pod("p1", {"app": "x", "tier": "web"}))
    core.create_namespaced_pod("default", _pod("p2", {"app": "x", "tier": "db"}))
    core.create_namespaced_pod("default", _pod("p3", {"app": "y"}))
    listing = kube_api.http.get("/api/v1/namespaces/default/pods").json()
    assert listing["kind"] == "PodList" and listing["apiVersion"] == "v1"

    def names(selector: str) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod("default", label_selector=selector).items]

    assert names("app=x") == ["p1", "p2"]
    assert names("app=x,tier!=db") == ["p1"]
    assert names("tier in (db, cache)") == ["p2"]
    assert names("app notin (x)") == ["p3"]
    assert names("!tier") == ["p3"]
    assert names("tier") == ["p1", "p2"]


def test_field_selector_filters_by_name(core):
    for name in ("f1", "f2"):
        core.create_namespaced_config_map("default", _config_map(name))
    found = core.list_namespaced_config_map("default", field_selector="metadata.name=f2").items
    assert [c.metadata.name for c in found] == ["f2"]


def test_bad_selector_is_400_with_a_message(core):
    with pytest.raises(ApiException) as err:
        core.list_namespaced_config_map("default", label_selector="a in (b")
    assert err.value.status == 400 and "labelSelector" in err.value.body


def test_namespaces_are_a_cluster_scoped_list(core):
    core.create_namespace({"metadata": {"name": "team-a"}})
    names = [n.metadata.name for n in core.list_namespace().items]
    assert {"default", "kube-system", "team-a"} <= set(names)
    assert core.read_namespace("team-a").metadata.uid


def test_list_across_all_namespaces(core):
    core.create_namespaced_config_map("n1", _config_map("x"))
    core.create_namespaced_config_map("n2", _config_map("x"))
    found = core.list_config_map_for_all_namespaces(label_selector="").items
    assert sorted(c.metadata.namespace for c in found) == ["n1", "n2"]


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400),
    (b'{"metadata": {"name": "c", "namespace": "other"}}', 400),
    (b'{"kind": "Secret", "metadata": {"name": "c"}}', 400),
    (b'{"metadata": {}}', 422),
])
def test_bad_create_is_rejected_with_a_message_and_stores_nothing(kube_api, body, status):
    url = f"{kube_api.url}/api/v1/namespaces/default/configmaps"
    response = kube_api.http.post(url, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    assert response.json()["kind"] == "Status" and response.json()["message"]
    assert kube_api.http.get(url).json()["items"] == []


def test_unknown_resource_is_404(kube_api):
    response = kube_api.http.get("/apis/nothing.example.com/v1/things")
    assert response.status_code == 404


def _pod(name: str, labels: dict) -> dict:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def test_an_injected_failure_is_served_once_and_stores_nothing(kube_api, core):
    import kmock

    kube_api.emulator["post", kmock.resource("", "v1", "configmaps")][:1] << 503 << {
        "kind": "Status", "apiVersion": "v1", "code": 503, "message": "injected"}
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map("default", _config_map("c"))
    assert err.value.status == 503
    assert core.list_namespaced_config_map("default").items == []
    assert core.create_namespaced_config_map("default", _config_map("c")).metadata.uid


def test_the_request_log_records_what_clients_sent(kube_api, core):
    core.create_namespaced_config_map("default", _config_map("logged"))
    core.list_namespaced_config_map("default", label_selector="a=b")
    posts = [r for r in kube_api.emulator.requests if r.method == "POST"]
    assert posts[-1].data["metadata"]["name"] == "logged"
    assert kube_api.emulator.requests[-1].params["labelSelector"] == "a=b"


def test_load_kube_config_without_arguments_finds_the_emulator(kube_api):
    kubernetes.config.load_kube_config()  # what in-process operator/gateway code does
    with kubernetes.client.ApiClient() as client:
        names = [n.metadata.name for n in kubernetes.client.CoreV1Api(client).list_namespace().items]
    assert "default" in names
