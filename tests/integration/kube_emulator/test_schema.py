"""Custom objects against their CRD's structural schema: pruning, defaulting, validation."""
from __future__ import annotations

import kubernetes
import pytest
from kubernetes.client import ApiException

from tests.integration.kube_emulator.crd_samples import GADGET, GADGETS, GROUP, VERSION, write_gadget_crd


@pytest.fixture
def gadgets(kube_api, tmp_path):
    kube_api.apply_crd(write_gadget_crd(tmp_path))
    api = kubernetes.client.CustomObjectsApi(kube_api.api_client())

    class Gadgets:
        def create(self, spec: dict) -> dict:
            return api.create_namespaced_custom_object(GROUP, VERSION, "default", GADGETS,
                                                       {**GADGET, "metadata": {"name": "g"}, "spec": spec})

        def patch_status(self, status: dict) -> dict:
            return api.patch_namespaced_custom_object_status(GROUP, VERSION, "default", GADGETS, "g",
                                                             {"status": status})

        def replace_status(self, status: dict) -> dict:
            current = api.get_namespaced_custom_object(GROUP, VERSION, "default", GADGETS, "g")
            return api.replace_namespaced_custom_object_status(GROUP, VERSION, "default", GADGETS,
                                                               "g", {**current, "status": status})

        def patch(self, body: dict) -> dict:
            return api.patch_namespaced_custom_object(GROUP, VERSION, "default", GADGETS, "g", body)

    return Gadgets()


def test_defaults_apply_top_down_and_unknown_fields_are_pruned(gadgets):
    created = gadgets.create({"size": 2, "typo": 1, "extra": {"anything": {"goes": True}}})
    assert created["spec"] == {"size": 2, "mode": "fast", "tuning": {"window": 5.0},
                               "extra": {"anything": {"goes": True}}}


def test_with_strict_field_validation_an_unknown_field_is_a_400_naming_it(kube_api, gadgets):
    # What kubectl and Helm send (the real API server refuses the typo; pruning would hide it).
    response = kube_api.http.post(f"/apis/{GROUP}/{VERSION}/namespaces/default/{GADGETS}",
                                  params={"fieldValidation": "Strict"},
                                  json={**GADGET, "metadata": {"name": "g"},
                                        "spec": {"size": 2, "typo": 1, "tuning": {"windw": 1}}})
    assert response.status_code == 400, response.text
    assert response.json()["message"] == ('strict decoding error: unknown field "spec.typo", '
                                          'unknown field "spec.tuning.windw"')
    assert kube_api.http.get(f"/apis/{GROUP}/{VERSION}/namespaces/default/{GADGETS}").json()["items"] == []


def test_undeclared_status_fields_are_dropped(gadgets):
    gadgets.create({"size": 1})
    patched = gadgets.patch_status({"phase": "Ready", "undeclared": "lost"})
    assert patched["status"] == {"phase": "Ready"}


def test_nulls_stay_only_where_nullable(gadgets):
    gadgets.create({"size": 1})
    replaced = gadgets.replace_status({"phase": None, "pressure": None})
    assert replaced["status"] == {"pressure": None}


@pytest.mark.parametrize("spec, field", [
    ({"size": 0}, "spec.size"),
    ({"size": "two"}, "spec.size"),
    ({"size": 1, "mode": "medium"}, "spec.mode"),
    ({}, "spec"),
    ({"size": 1, "port": 1.5}, "spec.port"),
])
def test_schema_violations_are_422_naming_the_field(gadgets, spec, field):
    with pytest.raises(ApiException) as err:
        gadgets.create(spec)
    assert err.value.status == 422 and field in err.value.body


def test_int_or_string_takes_both(gadgets):
    gadgets.create({"size": 1, "port": "http"})
    assert gadgets.patch({"spec": {"port": 8080}})["spec"]["port"] == 8080


def test_an_invalid_update_changes_nothing(gadgets):
    gadgets.create({"size": 1})
    with pytest.raises(ApiException) as err:
        gadgets.patch({"spec": {"size": -1}})
    assert err.value.status == 422
    assert gadgets.patch({})["spec"]["size"] == 1
