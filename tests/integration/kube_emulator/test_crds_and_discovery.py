"""CRDs applied from files become servable; discovery answers as kube-apiserver's does."""
from __future__ import annotations

import pathlib

import httpx
import kubernetes
import pytest
import yaml
from kubernetes.client import ApiException

from tests.integration.kube_emulator.crd_samples import GROUP, KIND, PLURAL, VERSION, WIDGET, write_widget_crd

REPO_CRDS = sorted((pathlib.Path(__file__).parents[3] / "charts" / "laps" / "crds").glob("*.yaml"))


def test_applied_crd_serves_its_kind_with_a_status_subresource(kube_api, tmp_path):
    assert kube_api.apply_crd(write_widget_crd(tmp_path)) == [f"{PLURAL}.{GROUP}"]
    objects = kubernetes.client.CustomObjectsApi(kube_api.api_client())
    objects.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL,
                                            {**WIDGET, "metadata": {"name": "w"}, "spec": {"size": 3}})
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "w",
                                                  {"status": {"phase": "Ready"}})
    widget = objects.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w")
    assert widget["kind"] == KIND and widget["status"] == {"phase": "Ready"}
    listed = objects.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert listed["kind"] == f"{KIND}List" and len(listed["items"]) == 1


def test_crd_is_established_and_discoverable(kube_api, tmp_path):
    kube_api.apply_crd(write_widget_crd(tmp_path))
    ext = kubernetes.client.ApiextensionsV1Api(kube_api.api_client())
    crd = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"

    resources = {r.name: r for r in kubernetes.client.CustomObjectsApi(
        kube_api.api_client()).get_api_resources(GROUP, VERSION).resources}
    assert resources[PLURAL].kind == KIND and resources[PLURAL].namespaced is True
    assert resources[PLURAL].short_names == ["wdg"]
    assert f"{PLURAL}/status" in resources


def test_applying_a_crd_twice_replaces_it(kube_api, tmp_path):
    path = write_widget_crd(tmp_path)
    kube_api.apply_crd(path)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["names"]["shortNames"] = ["wd"]
    path.write_text(yaml.safe_dump(doc))
    kube_api.apply_crd(path)
    crd = kubernetes.client.ApiextensionsV1Api(kube_api.api_client()).read_custom_resource_definition(
        f"{PLURAL}.{GROUP}")
    assert crd.spec.names.short_names == ["wd"]
    resources = kubernetes.client.CustomObjectsApi(kube_api.api_client()).get_api_resources(GROUP, VERSION)
    assert {r.name: r.short_names for r in resources.resources}[PLURAL] == ["wd"]


def test_deleting_the_crd_removes_its_resource(kube_api, tmp_path):
    kube_api.apply_crd(write_widget_crd(tmp_path))
    objects = kubernetes.client.CustomObjectsApi(kube_api.api_client())
    objects.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, {**WIDGET, "metadata": {"name": "w"}})
    kubernetes.client.ApiextensionsV1Api(kube_api.api_client()).delete_custom_resource_definition(
        f"{PLURAL}.{GROUP}")
    with pytest.raises(ApiException) as err:
        objects.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert err.value.status == 404


def test_an_incomplete_crd_is_422(kube_api):
    response = kube_api.http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                          json={"metadata": {"name": "x.y"}, "spec": {"group": "y"}})
    assert response.status_code == 422 and "names" in response.json()["message"]


@pytest.mark.skipif(not REPO_CRDS, reason="no charts/laps/crds/*.yaml in the repository yet")
@pytest.mark.parametrize("path", REPO_CRDS, ids=lambda p: p.name)
def test_repository_crds_apply_and_serve_their_kinds(kube_api, path):
    names = kube_api.apply_crd(path)
    assert names
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for version in spec["versions"]:
            found = kubernetes.client.CustomObjectsApi(kube_api.api_client()).get_api_resources(
                spec["group"], version["name"])
            assert spec["names"]["plural"] in {r.name for r in found.resources}


def test_discovery_paths(kube_api):
    apis = kube_api.http.get("/apis/").json()  # the trailing slash client-go uses
    assert apis["kind"] == "APIGroupList"
    assert "discovery.k8s.io" in {g["name"] for g in apis["groups"]}
    core = kube_api.http.get("/api/v1").json()
    assert core["groupVersion"] == "v1"
    assert {"pods", "pods/status", "namespaces"} <= {r["name"] for r in core["resources"]}
    versions = kubernetes.client.CoreApi(kube_api.api_client()).get_api_versions()
    assert versions.versions == ["v1"]
    groups = kubernetes.client.ApisApi(kube_api.api_client()).get_api_versions()
    assert "apps" in {g.name for g in groups.groups}
    autoscaling = next(g for g in groups.groups if g.name == "autoscaling")
    assert autoscaling.preferred_version.version == "v2"  # GA, newest first
    assert kubernetes.client.AppsApi(kube_api.api_client()).get_api_group().name == "apps"
    assert kubernetes.client.VersionApi(kube_api.api_client()).get_code().major


async def test_the_fixture_serves_async_tests(kube_api):
    async with httpx.AsyncClient(base_url=kube_api.url, headers=kube_api.admin_headers) as client:
        created = await client.post("/api/v1/namespaces/default/configmaps",
                                    json={"metadata": {"name": "from-async"}})
        assert created.status_code == 201
        listing = await client.get("/api/v1/namespaces/default/configmaps")
    assert [i["metadata"]["name"] for i in listing.json()["items"]] == ["from-async"]
    assert kube_api.find("v1/configmaps", "default", "from-async")["metadata"]["uid"]
