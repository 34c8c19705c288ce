"""An in-memory stand-in for `laps_operator.reconcile.kube.Kube` for unit tests of the writers: objects
by Ref, RFC 7386 merge patches, resourceVersion preconditions (409), a log of every write.

It checks what the operator sends, not what an API server does with it (the e2e tests run the
operator against the API emulator for that)."""
from __future__ import annotations

import copy
from typing import Any

from laps_operator.reconcile.kube import KubeError, Ref, field_value


def merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.writes: list[tuple[str, Ref, dict]] = []   # (verb, ref, body) in order
        self.version = 0
        self.fail_next: list[KubeError] = []
        # What an API server would refuse: (verb, manifest or patch, dry run) -> an error or None.
        self.refuse: Any = lambda verb, ref, body, dry: None
        self.dry_runs: list[tuple[str, Ref]] = []

    def _key(self, ref: Ref) -> tuple[str, str, str]:
        return (ref.kind, ref.namespace, ref.name)

    def add(self, obj: dict) -> dict:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {}).update(resourceVersion=str(self.version))
        self.objects[self._key(Ref.of(obj))] = obj
        return obj

    def get(self, ref: Ref) -> dict | None:
        obj = self.objects.get(self._key(ref))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, ref: Ref, label_selector: dict[str, str] | None = None,
             field_selector: dict[str, str] | None = None) -> list[dict]:
        found = [o for (kind, ns, _), o in sorted(self.objects.items()) if kind == ref.kind and ns == ref.namespace]
        return [copy.deepcopy(o) for o in found
                if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in (label_selector or {}).items())
                and all(field_value(o, k) == v for k, v in (field_selector or {}).items())]

    def patch(self, ref: Ref, patch: dict, *, subresource: str = "", dry_run: bool = False) -> dict:
        if self.fail_next:
            raise self.fail_next.pop(0)
        key = self._key(ref)
        if key not in self.objects:
            raise KubeError(404, f"{ref.kind} {ref.name} not found")
        if (refused := self.refuse("patch", ref, patch, dry_run)) is not None:
            raise refused
        if dry_run:
            self.dry_runs.append(("patch", ref))
            return merge(self.objects[key], patch)
        old = self.objects[key]
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified")
        if subresource == "status":
            new = {**old, "status": merge(old.get("status"), patch.get("status") or {})}
        else:
            new = merge(old, {k: v for k, v in patch.items() if k != "status"})
        self.version += 1
        new["metadata"]["resourceVersion"] = str(self.version)
        self.objects[key] = new
        self.writes.append(("patch" + (f"/{subresource}" if subresource else ""), ref, copy.deepcopy(patch)))
        return copy.deepcopy(new)

    def create(self, manifest: dict, *, dry_run: bool = False) -> dict:
        if (refused := self.refuse("create", Ref.of(manifest), manifest, dry_run)) is not None:
            raise refused
        if dry_run:
            self.dry_runs.append(("create", Ref.of(manifest)))
            return copy.deepcopy(manifest)
        self.writes.append(("create", Ref.of(manifest), copy.deepcopy(manifest)))
        return self.add(manifest)

    def delete(self, ref: Ref) -> bool:
        self.writes.append(("delete", ref, {}))
        return self.objects.pop(self._key(ref), None) is not None


def cluster(name: str = "c", namespace: str = "ns", *, replicas: int = 4, allocation: dict | None = None,
            status: dict | None = None) -> dict:
    return {"apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster",
            "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 1},
            "spec": {"model": {"name": "m", "path": "/m"}, "prefill": {"replicas": replicas},
                     "laps": {"allocation": {"enabled": True, "intervalSeconds": 1, "confirmIntervals": 1,
                                             "cooldownSeconds": 0, **(allocation or {})}}},
            "status": status or {}}


def prefill_pod(name: str, group: str | None, cluster_name: str = "c", namespace: str = "ns",
                ready: bool = True) -> dict:
    """A prefill pod as its StatefulSet made it and the kubelet reports it (Ready, by default)."""
    labels = {"laps.io/cluster": cluster_name, "laps.io/role": "prefill"}
    if group:
        labels["laps.io/prefill-group"] = group
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
