"""Idempotent create-or-patch of the manifests the builders produce, with `kubectl apply`-like
three-way merges.

Every child carries the manifest the operator last applied to it (annotation
`laps.io/last-applied`, compact JSON). A patch is computed from (last applied, desired, live):
what the operator set before and no longer wants is removed (null in the merge patch), what
differs from the live object is set, and everything else on the live object (fields written by
controllers, defaulting, HPA, `kubectl label` users) is left alone. An object that already
holds every desired field gets no write at all, so a restarted operator changes nothing; one
that differs is merge-patched in place (a rolling update for workloads), never recreated.
"""
from __future__ import annotations

import json
from typing import Any

LAST_APPLIED = "laps.io/last-applied"

# Identity and server-owned parts of an object: never part of a patch.
_IDENTITY = ("apiVersion", "kind")
_SERVER_META = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink")


# Maps whose values are resource quantities (container `resources`, pod `overhead`): the API
# server stores them canonicalised (`cpu: 1000m` reads back as "1", `memory: 1024Mi` as "1Gi").
_QUANTITY_MAPS = frozenset({"requests", "limits", "overhead"})


def contains(live: Any, desired: Any, *, quantities: bool = False, literal: bool = False) -> bool:
    """True when `live` already holds everything in `desired` (extra server-set fields ignored).
    With `quantities` (set below the keys of _QUANTITY_MAPS), scalars compare as quantities;
    with `literal` (the keys of a _LITERAL_MAPS map), every key is data, kept as written."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(_holds(live, k, v, quantities, literal) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(contains(a, b) for a, b in zip(live, desired)))
    if quantities and _scalar(desired) and _scalar(live):
        return same_quantity(live, desired)
    if _number(desired) and _number(live):
        return live == desired
    if _scalar(desired) and _scalar(live) and type(desired) is not type(live):
        # A server stores quantities as strings: `nvidia.com/gpu: 2` comes back as "2".
        return str(live) == str(desired)
    return live == desired


def same_quantity(a: Any, b: Any) -> bool:
    """Kubernetes quantities compared by value ("1000m" == "1", "1Gi" == "1024Mi"); anything
    that is not a quantity compares as text."""
    if str(a) == str(b):
        return True
    from kubernetes.utils.quantity import parse_quantity  # the client's own parser

    try:
        return parse_quantity(a) == parse_quantity(b)
    except (ValueError, TypeError, ArithmeticError):
        return False


def _holds(live: dict[str, Any], key: str, desired: Any, quantities: bool = False, literal: bool = False) -> bool:
    if key not in live:
        # A real API server omits empty lists and maps (`volumes: []`) when it serialises an
        # object, and the zero value of a non-pointer `omitempty` field: "" (an env var's or a
        # toleration's `value`), false (a mount's `readOnly`), 0. Counting that as a difference
        # would patch on every reconcile (and the resync call it a repair). A pointer field
        # keeps its zero (`allowPrivilegeEscalation: false`, `tolerationSeconds: 0`), so one
        # missing live was removed and is put back. A null asks for the key to be absent.
        if desired is None or desired == [] or desired == {}:
            return True
        return (not literal and key in _OMITTED_WHEN_ZERO and not desired
                and isinstance(desired, (str, bool, int, float)))
    return contains(live[key], desired, quantities=quantities or key in _QUANTITY_MAPS, literal=key in _LITERAL_MAPS)


# The non-pointer `omitempty` scalar fields (k8s.io/api core/v1 and apps/v1) the children can
# carry at their zero value; every other scalar the server stores as written. By field name at
# any depth but inside the string maps of _LITERAL_MAPS (a ConfigMap key `value: ""` is data): no
# other field of the children, nor of the LAPSCluster status (`contains` compares that too), has
# these names with a zero value of its own.
_OMITTED_WHEN_ZERO = frozenset({
    "value", "key", "operator", "effect",                        # EnvVar, Toleration
    "readOnly", "subPath", "subPathExpr",                        # VolumeMount, volume sources
    "medium", "hostPort", "hostIP", "nodePort",                  # emptyDir, ports
    "workingDir", "stdin", "tty", "hostNetwork", "hostPID", "hostIPC",
    "priorityClassName", "schedulerName", "serviceAccountName", "hostname", "subdomain",
    "initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold",
    "minReadySeconds",
})


# Maps whose keys are data, not fields: the server keeps every entry, "" values included.
_LITERAL_MAPS = frozenset({"data", "stringData", "binaryData", "labels", "annotations", "matchLabels",
                           "nodeSelector", "selector"})


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def last_applied_json(manifest: dict[str, Any]) -> str:
    """The annotation's value for `manifest`: compact, key-sorted JSON (stable across runs, so
    an unchanged spec never rewrites it), without the annotation itself."""
    return json.dumps(_without_last_applied(manifest), sort_keys=True, separators=(",", ":"))


def with_last_applied(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` with its own last-applied annotation: what is created or patched."""
    meta = dict(manifest.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), LAST_APPLIED: last_applied_json(manifest)}
    return {**manifest, "metadata": meta}


def last_applied_of(live: dict[str, Any] | None) -> dict[str, Any]:
    """What the operator last applied to `live`; {} for an object it never annotated (created by
    an older operator or by hand) or one whose annotation was mangled, so nothing is removed."""
    raw = (((live or {}).get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    if not isinstance(raw, str):
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def three_way_patch(last_applied: dict[str, Any] | None, desired: dict[str, Any],
                    live: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that brings `live` to `desired`, removing what
    `last_applied` had and `desired` no longer has. Lists are replaced whole. {} when nothing
    needs changing. Pure: no server involved."""
    last = _patchable(last_applied or {})
    want = _patchable(desired)
    current = _patchable(live)
    return _merge(_removals(last, want, current), _changes(current, want))


def _patchable(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` minus identity, status and server-owned metadata."""
    out = {k: v for k, v in obj.items() if k not in (*_IDENTITY, "status")}
    if isinstance(out.get("metadata"), dict):
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k not in _SERVER_META}
    return out


def _removals(last: dict[str, Any], desired: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """Nulls for keys the operator set before and dropped since. Only keys still present live:
    a null for an absent key would be a write that changes nothing."""
    out: dict[str, Any] = {}
    for key, before in last.items():
        if key not in live:
            continue
        if key not in desired:
            if isinstance(before, dict) and isinstance(live[key], dict) and set(live[key]) - set(before):
                # Others added keys to a map we no longer want (a label, an annotation): take
                # back only ours instead of dropping the whole map with theirs.
                nested = _removals(before, {}, live[key])
                if nested:
                    out[key] = nested
            else:
                out[key] = None
        elif isinstance(before, dict) and isinstance(desired[key], dict) and isinstance(live[key], dict):
            nested = _removals(before, desired[key], live[key])
            if nested:
                out[key] = nested
    return out


def _changes(live: dict[str, Any], desired: dict[str, Any], quantities: bool = False,
             literal: bool = False) -> dict[str, Any]:
    """Desired values that `live` does not hold yet, as narrowly as maps allow."""
    out: dict[str, Any] = {}
    for key, want in desired.items():
        if _holds(live, key, want, quantities, literal):
            continue
        have = live.get(key)
        if isinstance(want, dict) and isinstance(have, dict):
            out[key] = _changes(have, want, quantities or key in _QUANTITY_MAPS, key in _LITERAL_MAPS)
        else:
            out[key] = want
    return out


def _merge(removals: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(removals)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _without_last_applied(manifest: dict[str, Any]) -> dict[str, Any]:
    meta = manifest.get("metadata")
    if not isinstance(meta, dict) or LAST_APPLIED not in (meta.get("annotations") or {}):
        return manifest
    annotations = {k: v for k, v in meta["annotations"].items() if k != LAST_APPLIED}
    meta = {k: v for k, v in meta.items() if k != "annotations"}
    if annotations:
        meta["annotations"] = annotations
    return {**manifest, "metadata": meta}
