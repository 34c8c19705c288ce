"""Idempotent create-or-patch of the manifests the builders produce.

An object that already holds every field of its manifest is left alone (no write, so a
restarted operator changes nothing); one that differs is merge-patched in place (a rolling
update for workloads), never deleted and recreated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .kube import Kube, KubeError, Ref


Action = Literal["created", "patched", "unchanged", "deleted", "skipped"]


@dataclass(frozen=True)
class Applied:
    ref: Ref
    action: Action
    detail: str = ""


def contains(live: Any, desired: Any) -> bool:
    """True when `live` already holds everything in `desired` (extra server-set fields ignored)."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(contains(a, b) for a, b in zip(live, desired)))
    if _number(desired) and _number(live):
        return live == desired
    if _scalar(desired) and _scalar(live) and type(desired) is not type(live):
        # A server stores quantities as strings: `nvidia.com/gpu: 2` comes back as "2".
        return str(live) == str(desired)
    return live == desired


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def merge_patch_for(live: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """The merge patch turning `live` into something that contains `desired`: only the top-level
    sections that differ, so fields the server owns (status, resourceVersion...) stay out."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "metadata":
            meta = {k: v for k, v in value.items() if k in ("labels", "annotations", "ownerReferences")
                    and not contains(live.get("metadata", {}).get(k), v)}
            if meta:
                patch["metadata"] = meta
        elif not contains(live.get(key), value):
            patch[key] = value
    return patch


def apply(kube: Kube, manifest: dict[str, Any]) -> Applied:
    ref = Ref.of(manifest)
    live = kube.get(ref)
    if live is None:
        try:
            kube.create(manifest)
            return Applied(ref, "created")
        except KubeError as exc:
            if exc.status != 409:
                raise
            # Someone (a previous run of ours) created it between our read and write.
            live = kube.get(ref) or {}
    patch = merge_patch_for(live, manifest)
    if not patch:
        return Applied(ref, "unchanged")
    kube.patch(ref, patch)
    return Applied(ref, "patched", ",".join(sorted(patch)))


def apply_all(kube: Kube, manifests: list[dict[str, Any]], optional_kinds: frozenset[str] = frozenset()
              ) -> list[Applied]:
    """Apply in order. Kinds in `optional_kinds` (e.g. PodMonitor) may be missing from the
    cluster: their 404 is reported as skipped instead of failing the reconcile."""
    results = []
    for manifest in manifests:
        try:
            results.append(apply(kube, manifest))
        except KubeError as exc:
            if exc.status == 404 and manifest["kind"] in optional_kinds:
                results.append(Applied(Ref.of(manifest), "skipped", f"{manifest['kind']} API not available"))
                continue
            raise
    return results


def delete_if_owned(kube: Kube, ref: Ref, owner_uid: str) -> Applied | None:
    """Delete an object we no longer want, but only if this cluster owns it."""
    try:
        live = kube.get(ref)
    except KubeError as exc:
        if exc.status == 404:  # the kind itself is not served
            return None
        raise
    if live is None:
        return None
    owners = (live.get("metadata") or {}).get("ownerReferences") or []
    if not any(o.get("uid") == owner_uid for o in owners):
        return None
    kube.delete(ref)
    return Applied(ref, "deleted")
