"""Three-way merge patches: removing a field from the spec removes it from the live child, and
nothing anyone else wrote is touched. Pure functions, no server."""
from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from laps_operator.naming import ClusterRef
from laps_operator.reconcile.apply import (
    LAST_APPLIED,
    contains,
    last_applied_json,
    last_applied_of,
    three_way_patch,
    with_last_applied,
)
from laps_operator.render.builders import build_prefill_statefulset
from laps_operator.spec.cluster import parse_spec
from tests.support.kube_emulator_rules import merge_patch  # RFC 7386, as the API server applies it

CLUSTER = ClusterRef("c", "ns", "uid-1")


def statefulset(**spec_changes: Any) -> dict[str, Any]:
    spec = {"model": {"name": "m", "path": "/m"}, "prefill": {"replicas": 2}, **spec_changes}
    return with_last_applied(build_prefill_statefulset(CLUSTER, parse_spec(spec)))


def as_stored(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a server returns after creating `manifest`: server metadata, defaults and status."""
    live = copy.deepcopy(manifest)
    live["metadata"].update(uid="sts-uid", resourceVersion="11", generation=1, creationTimestamp="t")
    live["spec"]["revisionHistoryLimit"] = 10
    live["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    live["status"] = {"replicas": 2, "readyReplicas": 2}
    return live


def apply_to(live: dict[str, Any], desired: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    patch = three_way_patch(last_applied_of(live), desired, live)
    return patch, merge_patch(live, patch)


RICH = {
    "engine": {"env": [{"name": "OMP_NUM_THREADS", "value": "2"}, {"name": "DEBUG", "value": "1"}],
               "extraArgs": ["--log-level", "debug"]},
    "prefill": {"replicas": 2, "nodeSelector": {"pool": "prefill"},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
}
PLAIN = {"engine": {"env": [{"name": "OMP_NUM_THREADS", "value": "2"}]}, "prefill": {"replicas": 2}}


def test_fields_dropped_from_the_spec_leave_the_statefulset():
    live = as_stored(statefulset(**RICH))
    live["metadata"]["labels"]["team"] = "ml"  # someone else's label
    patch, after = apply_to(live, statefulset(**PLAIN))

    pod = after["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod
    engine = pod["containers"][0]
    assert [e["name"] for e in engine["env"] if e["name"] in ("OMP_NUM_THREADS", "DEBUG")] == ["OMP_NUM_THREADS"]
    assert "--log-level" not in engine["args"]
    assert after["metadata"]["labels"]["team"] == "ml"
    assert after["spec"]["revisionHistoryLimit"] == 10 and after["status"] == live["status"]
    assert "labels" not in patch["metadata"]  # nobody's labels were rewritten
    # The next reconcile finds nothing to do.
    assert three_way_patch(last_applied_of(after), statefulset(**PLAIN), after) == {}


def test_fields_added_back_return():
    _, plain = apply_to(as_stored(statefulset(**PLAIN)), statefulset(**PLAIN))
    _, rich = apply_to(plain, statefulset(**RICH))
    assert rich["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "prefill"}
    assert contains(rich, statefulset(**RICH))


def test_an_unchanged_spec_needs_no_write():
    live = as_stored(statefulset(**RICH))
    assert three_way_patch(last_applied_of(live), statefulset(**RICH), live) == {}


def test_a_label_the_operator_dropped_is_removed_and_others_stay():
    last = {"metadata": {"name": "s", "labels": {"a": "1", "old": "x"}}, "spec": {"x": 1}}
    desired = with_last_applied({"metadata": {"name": "s", "labels": {"a": "1"}}, "spec": {"x": 1}})
    live = {"metadata": {"name": "s", "labels": {"a": "1", "old": "x", "team": "ml"},
                         "annotations": {LAST_APPLIED: last_applied_json(last), "note": "hi"}},
            "spec": {"x": 1}}
    patch = three_way_patch(last_applied_of(live), desired, live)
    assert patch["metadata"]["labels"] == {"old": None}
    assert patch["metadata"]["annotations"] == {LAST_APPLIED: last_applied_json(desired)}
    assert "spec" not in patch


def test_a_dropped_map_keeps_what_others_added_to_it():
    last = {"metadata": {"name": "s", "annotations": {"ours": "1"}}}
    live = {"metadata": {"name": "s", "annotations": {"ours": "1", "deployment.kubernetes.io/revision": "3"}}}
    patch = three_way_patch(last, {"metadata": {"name": "s"}}, live)
    assert patch == {"metadata": {"annotations": {"ours": None}}}
    alone = {"metadata": {"name": "s", "annotations": {"ours": "1"}}}
    assert three_way_patch(last, {"metadata": {"name": "s"}}, alone) == {"metadata": {"annotations": None}}


def test_objects_without_a_record_only_gain_fields():
    # Created by an older operator, or by hand: nothing is known to be ours, nothing is removed.
    live = {"metadata": {"name": "s"}, "spec": {"nodeSelector": {"pool": "a"}, "replicas": 1}}
    desired = {"metadata": {"name": "s"}, "spec": {"replicas": 2}}
    assert three_way_patch(None, desired, live) == {"spec": {"replicas": 2}}
    live["metadata"]["annotations"] = {LAST_APPLIED: "{not json"}
    assert last_applied_of(live) == {}


def test_a_field_already_gone_live_causes_no_write():
    last = {"spec": {"nodeSelector": {"pool": "a"}, "replicas": 1}}
    assert three_way_patch(last, {"spec": {"replicas": 1}}, {"spec": {"replicas": 1}}) == {}


def test_empty_lists_the_server_omits_are_not_a_difference():
    desired = {"spec": {"volumes": [], "containers": [{"name": "g", "volumeMounts": []}]}}
    live = {"spec": {"containers": [{"name": "g", "image": "x"}]}}
    assert three_way_patch(desired, desired, live) == {}


def test_zero_values_the_server_omits_are_not_a_difference():
    """A user's `env: [{name: NO_PROXY, value: ""}]`, a toleration with `value: ""`, a model
    volume with `readOnly: false`: a real API server stores none of these zero values, so the
    live object never shows them; they must not be patched (and called a repair) every resync."""
    desired = {"spec": {"template": {"spec": {
        "containers": [{"name": "engine", "env": [{"name": "NO_PROXY", "value": ""}]}],
        "tolerations": [{"key": "gpu", "operator": "Equal", "value": "", "effect": "NoSchedule"}],
        "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "m", "readOnly": False}}]}}}}
    live = {"spec": {"template": {"spec": {
        "containers": [{"name": "engine", "env": [{"name": "NO_PROXY"}]}],
        "tolerations": [{"key": "gpu", "operator": "Equal", "effect": "NoSchedule"}],
        "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "m"}}]}}}}
    assert three_way_patch(desired, desired, live) == {}
    # A pointer field's zero is stored by the server: one missing live is written (an upgrade
    # adding `allowPrivilegeEscalation: false`) and put back when someone removes it by hand.
    secured = copy.deepcopy(desired)
    secured["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False}
    assert three_way_patch(desired, secured, live) == {"spec": {"template": {"spec": {
        "containers": secured["spec"]["template"]["spec"]["containers"]}}}}
    stored = copy.deepcopy(live)
    stored["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False}
    assert three_way_patch(secured, secured, stored) == {}
    assert three_way_patch(secured, secured, live) == {"spec": {"template": {"spec": {
        "containers": secured["spec"]["template"]["spec"]["containers"]}}}}
    tolerating, evictable = copy.deepcopy(desired), copy.deepcopy(live)
    tolerating["spec"]["template"]["spec"]["tolerations"][0].update(effect="NoExecute", tolerationSeconds=0)
    evictable["spec"]["template"]["spec"]["tolerations"][0].update(effect="NoExecute")
    assert three_way_patch(tolerating, tolerating, evictable)["spec"]["template"]["spec"]["tolerations"] \
        == tolerating["spec"]["template"]["spec"]["tolerations"]
    # A value that is not the zero value is still a difference.
    changed = {"spec": {"template": {"spec": {**desired["spec"]["template"]["spec"],
                                              "containers": [{"name": "engine", "env": [{"name": "NO_PROXY", "value": "x"}]}]}}}}
    assert three_way_patch(desired, changed, live) == {"spec": {"template": {"spec": {
        "containers": changed["spec"]["template"]["spec"]["containers"]}}}}


def test_an_empty_value_in_a_map_of_data_is_written():
    """`value: ""` is a field's zero value in an env var, but data in a ConfigMap or a label map:
    the server keeps it, so one missing live is written."""
    desired = {"data": {"value": "", "key": ""}, "metadata": {"labels": {"value": ""}}}
    live = {"data": {}, "metadata": {"labels": {}}}
    assert three_way_patch(desired, desired, live) == desired


def test_identity_and_server_fields_are_never_patched():
    desired = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"},
               "data": {"k": "v"}}
    live = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "3"},
            "data": {"k": "old"}, "status": {"x": 1}}
    assert three_way_patch({**desired, "status": {"y": 1}}, desired, live) == {"data": {"k": "v"}}


def test_the_record_is_stable_and_excludes_itself():
    manifest = {"kind": "ConfigMap", "metadata": {"name": "c", "annotations": {"note": "hi"}},
                "data": {"b": "2", "a": "1"}}
    reordered = {"data": {"a": "1", "b": "2"}, "metadata": {"annotations": {"note": "hi"}, "name": "c"},
                 "kind": "ConfigMap"}
    annotated = with_last_applied(manifest)
    assert annotated["metadata"]["annotations"]["note"] == "hi"
    assert last_applied_json(manifest) == last_applied_json(reordered) == last_applied_json(annotated)
    assert last_applied_of(annotated) == manifest
    assert " " not in annotated["metadata"]["annotations"][LAST_APPLIED]
    assert "metadata" in manifest and "annotations" in manifest["metadata"]
    assert LAST_APPLIED not in manifest["metadata"]["annotations"]  # the input is not modified


# Random JSON documents over a few keys, so that last-applied, desired and live overlap.
KEYS = st.sampled_from(["a", "b", "c", "d"])
LEAVES = st.one_of(st.integers(-3, 3), st.sampled_from(["x", "y"]), st.booleans())
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=2),
                                                      st.dictionaries(KEYS, inner, max_size=3)), max_leaves=8)
DOCS = st.dictionaries(KEYS, VALUES, max_size=4)


def removed_paths(last: Any, desired: Any, prefix: tuple = ()) -> list[tuple]:
    if not (isinstance(last, dict) and isinstance(desired, dict)):
        return []
    out = []
    for key, value in last.items():
        if key not in desired:
            out.append((*prefix, key))
        else:
            out += removed_paths(value, desired[key], (*prefix, key))
    return out


def at(doc: Any, path: tuple) -> tuple[bool, Any]:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return False, None
        doc = doc[key]
    return True, doc


@settings(max_examples=300, deadline=None)
@given(last=DOCS, desired=DOCS, live=DOCS)
def test_patched_object_is_desired_minus_dropped_fields_plus_others(last, desired, live):
    patch = three_way_patch(last, desired, live)
    after = merge_patch(live, patch)
    assert contains(after, desired)
    for path in removed_paths(last, desired):
        present, value = at(after, path)
        if present:  # kept only for keys someone else added to a map the operator dropped
            ours, theirs = at(last, path)[1], at(live, path)[1]
            assert isinstance(value, dict) and isinstance(ours, dict) and set(theirs) - set(ours), path
            assert all(k not in ours or isinstance(ours[k], dict) for k in value), path
    # Keys nobody asked about (neither in last-applied nor desired) keep their live values.
    for key, value in live.items():
        if key not in last and key not in desired:
            assert after[key] == value
    # Applying again changes nothing: no write on the next reconcile.
    assert three_way_patch(desired, desired, after) == {}


def canonicalised(live: dict[str, Any]) -> dict[str, Any]:
    """The quantities as the API server stores them (`cpu: 1000m` -> "1", `2048Mi` -> "2Gi")."""
    live = copy.deepcopy(live)
    resources = live["spec"]["template"]["spec"]["containers"][0]["resources"]
    resources["requests"] = {"cpu": "1", "memory": "2Gi"}
    resources["limits"] = {"memory": "4294967296"}
    return live


def test_quantities_the_server_canonicalised_need_no_write():
    # Before: a patch (and a "Repaired" Event) on every resync, for values that were equal.
    resources = {"requests": {"cpu": "1000m", "memory": "2048Mi"}, "limits": {"memory": "4Gi"}}
    desired = statefulset(prefill={"replicas": 2, "resources": resources})
    live = canonicalised(as_stored(desired))
    assert three_way_patch(last_applied_of(live), desired, live) == {}


def test_a_real_quantity_change_is_still_patched():
    desired = statefulset(prefill={"replicas": 2, "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}})
    live = canonicalised(as_stored(statefulset(prefill={"replicas": 2, "resources": {"requests": {"cpu": "1"}}})))
    patch = three_way_patch(last_applied_of(live), desired, live)
    # (lists are replaced whole: the container comes with everything it wants)
    assert patch["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1500m"


def test_only_resource_maps_compare_as_quantities():
    assert contains({"resources": {"limits": {"cpu": "1"}}}, {"resources": {"limits": {"cpu": "1000m"}}})
    assert contains({"overhead": {"memory": "1Gi"}}, {"overhead": {"memory": "1024Mi"}})
    # Elsewhere "1000m" and "1" are different strings (an argument, an annotation).
    assert not contains({"args": ["--x", "1"]}, {"args": ["--x", "1000m"]})
    assert not contains({"annotations": {"a": "1"}}, {"annotations": {"a": "1000m"}})
    assert not contains({"requests": {"cpu": "1"}}, {"requests": {"cpu": "2"}})
    assert not contains({"requests": {"cpu": "lots"}}, {"requests": {"cpu": "1"}})
