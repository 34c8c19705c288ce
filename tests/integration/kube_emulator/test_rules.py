"""The pure API-server rules the emulator applies (no server needed)."""
from __future__ import annotations

import pytest

from tests.support import kube_emulator_rules as rules


def _obj(labels: dict) -> dict:
    return {"metadata": {"name": "x", "labels": labels}, "status": {"phase": "Running"}}


@pytest.mark.parametrize("selector, labels, expected", [
    ("", {}, True),
    ("a=1", {"a": "1"}, True),
    ("a==1", {"a": "2"}, False),
    ("a!=1", {}, True),
    ("a in (1, 2),b", {"a": "2", "b": ""}, True),
    ("a notin (1,2)", {"a": "1"}, False),
    ("!a", {"a": "1"}, False),
    ("laps.io/prefill-group=short", {"laps.io/prefill-group": "short"}, True),
])
def test_label_selectors(selector, labels, expected):
    assert rules.parse_label_selector(selector)(_obj(labels)) is expected


@pytest.mark.parametrize("selector", ["a in (1", "=b", "a b"])
def test_malformed_label_selectors_are_400(selector):
    with pytest.raises(rules.ApiRuleError) as err:
        rules.parse_label_selector(selector)
    assert err.value.status == 400


def test_field_selectors_compare_fields_as_strings():
    assert rules.parse_field_selector("status.phase=Running,metadata.name!=y")(_obj({}))
    assert not rules.parse_field_selector("spec.nodeName=n1")(_obj({}))
    assert rules.parse_field_selector("spec.nodeName=")(_obj({}))  # absent is ""


def test_strategic_merge_directives():
    old = {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}],
                    "ports": [{"port": 80, "name": "http"}], "finalizers": ["x"]}}
    patch = {"spec": {"containers": [{"name": "b", "$patch": "delete"}, {"name": "c", "image": "2"}],
                      "ports": [{"port": 80, "name": "web"}], "finalizers": ["y"],
                      "$setElementOrder/containers": [{"name": "a"}, {"name": "c"}]}}
    merged = rules.strategic_merge(old, patch)
    assert [c["name"] for c in merged["spec"]["containers"]] == ["a", "c"]
    assert merged["spec"]["ports"] == [{"port": 80, "name": "web"}]
    assert merged["spec"]["finalizers"] == ["x", "y"]
    assert rules.strategic_merge(old, {"spec": {"$patch": "replace", "a": 1}}) == {"spec": {"a": 1}}


def test_merge_patch_follows_rfc_7386():
    assert rules.merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None}, "l": [2]}) == \
        {"a": {"c": 2}, "l": [2]}
    assert rules.merge_patch({"a": 1}, {"a": {"b": 2}}) == {"a": {"b": 2}}


def test_generated_names_use_the_api_server_alphabet():
    name = rules.generate_name("p-")
    assert name.startswith("p-") and len(name) == 7 and not set(name[2:]) & set("aeiou013")


def test_discovery_prefers_stable_newest_versions():
    group = {"versions": [{"version": v} for v in ("v1beta1", "v2", "v1", "v2alpha1")]}
    assert [v["version"] for v in rules.prefer_stable_versions(group)["versions"]] == \
        ["v2", "v1", "v1beta1", "v2alpha1"]
