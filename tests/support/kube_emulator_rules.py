"""Pure rules of the Kubernetes API server that the emulator (kube_emulator.py) reproduces.

No I/O here: selectors, the three PATCH flavours, name generation, timestamps. Each function
states which API-server behaviour it mirrors, so a test failure can be traced to a rule.
"""
from __future__ import annotations

import copy
import datetime
import random
import re
from collections.abc import Callable, Mapping
from typing import Any

import jsonpatch


class ApiRuleError(Exception):
    """A request the real API server rejects: carries the HTTP status and the Status reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def bad_request(message: str) -> ApiRuleError:
    return ApiRuleError(400, "BadRequest", message)


def invalid(message: str) -> ApiRuleError:
    return ApiRuleError(422, "Invalid", message)


# --- selectors -------------------------------------------------------------------------------

# One requirement of a label selector, as in apimachinery's labels.Parse: `k`, `!k`, `k=v`,
# `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`.
_LABEL_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_LABEL_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_REQ = re.compile(rf"^\s*(?P<key>{_LABEL_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*$")
_EQ_REQ = re.compile(rf"^\s*(?P<key>{_LABEL_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_LABEL_VALUE})\s*$")
_EXISTS_REQ = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_LABEL_KEY})\s*$")

LabelMatcher = Callable[[Mapping[str, str]], bool]
ObjectMatcher = Callable[[Mapping[str, Any]], bool]


def _split_requirements(text: str) -> list[str]:
    """Split on commas that are not inside `in (...)` value sets."""
    parts, depth, current = [], 0, []
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def _label_requirement(text: str) -> LabelMatcher:
    if m := _SET_REQ.match(text):
        key, values = m["key"], {v.strip() for v in m["values"].split(",") if v.strip()}
        if m["op"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _EQ_REQ.match(text):
        key, value = m["key"], m["value"]
        if m["op"] == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS_REQ.match(text):
        key, negated = m["key"], bool(m["neg"])
        return lambda labels: (key in labels) != negated
    raise bad_request(f"unable to parse requirement: {text.strip()!r} in labelSelector")


def parse_label_selector(text: str | None) -> ObjectMatcher:
    """`?labelSelector=`: every requirement must hold on metadata.labels (AND)."""
    requirements = [_label_requirement(part) for part in _split_requirements(text or "")]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(req(labels) for req in requirements)

    return matches


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""  # the API server compares an absent field as the empty string
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def parse_field_selector(text: str | None) -> ObjectMatcher:
    """`?fieldSelector=`: `path=v`, `path==v`, `path!=v` on dotted field paths (AND).

    The real server allows only a per-kind set of fields (metadata.name/namespace everywhere,
    status.phase for pods, ...); this one accepts any path, which is a superset."""
    requirements: list[tuple[str, bool, str]] = []
    for part in _split_requirements(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise bad_request(f"invalid field selector: {part.strip()!r}")
        requirements.append((m[1], m[2] == "!=", m[3]))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, path) == value) != negated
                   for path, negated, value in requirements)

    return matches


# --- patches ---------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (`application/merge-patch+json`): null deletes, lists replace."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Mapping[str, Any], operations: Any) -> dict[str, Any]:
    """RFC 6902 JSON patch; a failed `test` or a bad path is 422, as kopf expects."""
    if not isinstance(operations, list):
        raise bad_request("a JSON patch must be a list of operations")
    try:
        return jsonpatch.apply_patch(copy.deepcopy(dict(target)), operations)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise invalid(f"the server rejected our request due to an error in our request: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError,
            TypeError) as exc:
        raise invalid(f"the server rejected our request due to an error in our request: {exc}") from exc


# Lists that strategic merge patch merges by a key instead of replacing, as declared by
# `patchMergeKey` in the built-in types used here (pods, workloads, services, metadata).
STRATEGIC_MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "imagePullSecrets": "name",
    "ownerReferences": "uid", "conditions": "type", "hostAliases": "ip",
    "volumeDevices": "devicePath", "topologySpreadConstraints": "topologyKey",
}
# Lists of scalars with patchStrategy=merge: union instead of replace.
STRATEGIC_MERGE_SETS = frozenset({"finalizers"})
# Kinds whose lists are all atomic (`+listType=atomic`): a strategic merge patch replaces them,
# as a merge patch does (an EndpointSlice's `ports` are not a Service's, merged by port).
ATOMIC_LIST_KINDS = frozenset({"endpointslices", "endpoints"})


def _merge_list_by_key(old: list[Any], patch: list[Any], key: str) -> list[Any]:
    """Merge by `key`, in the order kube-apiserver gives (strategicpatch's normalizeElementOrder):
    the patch's items in patch order and the items only the server had in server order, merged so
    that two items the server had keep the server's order, and an item new to the server goes
    before a server-only one."""
    position = {item[key]: i for i, item in enumerate(old) if isinstance(item, Mapping) and key in item}
    merged, touched = [], set()
    for item in patch:
        if not isinstance(item, Mapping) or key not in item:
            merged.append(copy.deepcopy(item))
            continue
        index = position.get(item[key])
        if index is not None:
            touched.add(index)
        if item.get("$patch") != "delete":
            merged.append(strategic_merge(old[index] if index is not None else {}, item))
    server_only = [copy.deepcopy(item) for i, item in enumerate(old) if i not in touched]

    def at(item: Any) -> int | None:
        return position.get(item.get(key)) if isinstance(item, Mapping) else None
    result: list[Any] = []
    while merged or server_only:
        if merged and server_only:
            mine, theirs = at(merged[0]), at(server_only[0])
            take_server = mine is not None and theirs is not None and theirs < mine
        else:
            take_server = not merged
        result.append((server_only if take_server else merged).pop(0))
    return result


def _in_order(items: list[Any], order: Any, key: str) -> list[Any]:
    """`$setElementOrder/<list>` (what kubectl apply sends): the items it names in its order,
    then any others as they were."""
    if not isinstance(order, list):
        return items
    rank = {o.get(key): i for i, o in enumerate(order) if isinstance(o, Mapping)}
    named = sorted((i for i in items if isinstance(i, Mapping) and i.get(key) in rank), key=lambda i: rank[i[key]])
    return named + [i for i in items if not (isinstance(i, Mapping) and i.get(key) in rank)]


def _merge_ports(old: list[Any], patch: list[Any]) -> list[Any]:
    # Container ports merge by containerPort, Service ports by port: pick by what the items hold.
    sample = next((p for p in patch + old if isinstance(p, Mapping)), {})
    return _merge_list_by_key(old, patch, "containerPort" if "containerPort" in sample else "port")


def strategic_merge(target: Any, patch: Any) -> Any:
    """`application/strategic-merge-patch+json` for built-in kinds: like a merge patch, but
    lists named in STRATEGIC_MERGE_KEYS merge element-wise by their key, `finalizers` merge as
    a set, `$patch: replace|delete` is honoured on maps, `$setElementOrder/<list>` orders a
    list merged by key, and `$retainKeys` is accepted and dropped."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    base = {} if directive == "replace" or not isinstance(target, Mapping) else dict(target)
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        old = base.get(key)
        if value is None:
            base.pop(key, None)
        elif isinstance(value, list) and isinstance(old, list) and key in STRATEGIC_MERGE_KEYS:
            merge_key = STRATEGIC_MERGE_KEYS[key]
            base[key] = _in_order(_merge_list_by_key(old, value, merge_key),
                                  patch.get(f"$setElementOrder/{key}"), merge_key)
        elif isinstance(value, list) and isinstance(old, list) and key == "ports":
            base[key] = _merge_ports(old, value)
        elif isinstance(value, list) and isinstance(old, list) and key in STRATEGIC_MERGE_SETS:
            base[key] = old + [v for v in value if v not in old]
        else:
            merged = strategic_merge(old, value)
            if merged is None:
                base.pop(key, None)
            else:
                base[key] = merged
    return base


# --- views ---------------------------------------------------------------------------------

def prefer_stable_versions(group: dict) -> dict:
    """Order a group's versions as kube-apiserver does (GA, then beta, then alpha; newer
    first) and prefer the first; KMock's order comes from a set."""
    def priority(version: str) -> tuple[int, int, int]:
        m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
        if not m:
            return (-1, 0, 0)
        return ({"alpha": 0, "beta": 1, None: 2}[m[2]], int(m[1]), int(m[3] or 0))

    group["versions"].sort(key=lambda v: priority(v["version"]), reverse=True)
    group["preferredVersion"] = group["versions"][0]
    return group


def scale_of(obj: dict) -> dict:
    """The autoscaling/v1 Scale of a workload, as its `scale` subresource shows it."""
    meta, spec = obj["metadata"], obj.get("spec") or {}
    match_labels = (spec.get("selector") or {}).get("matchLabels") or {}
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                              "creationTimestamp") if k in meta},
            "spec": {"replicas": spec.get("replicas", 1)},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                       "selector": ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))}}


# --- server-set values -----------------------------------------------------------------------

# The alphabet of apimachinery's utilrand.String: no vowels, no confusable digits.
_GENERATE_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def generate_name(prefix: str) -> str:
    """`metadata.generateName`: the prefix plus five random characters."""
    return prefix + "".join(random.choices(_GENERATE_NAME_ALPHABET, k=5))


def now_rfc3339() -> str:
    """Timestamps as the API server writes them: UTC, whole seconds, `Z` suffix."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_object_name(name: Any) -> None:
    """The name rule every kind shares (apimachinery's path-segment rule; kinds add stricter
    ones, e.g. DNS-1123 for pods, which are not emulated): 422 otherwise."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "%" in name \
            or len(name) > 253:
        raise invalid(f"metadata.name: Invalid value: {name!r}: may not be '.' or '..', may "
                      "not contain '/' or '%', at most 253 characters")
