"""What kube-apiserver does with a CustomResourceDefinition: check it, serve its versions (with
their structural schemas), establish it, and stop serving them when it is deleted."""
from __future__ import annotations

from typing import Any

import kmock

from tests.support import kube_emulator_rules as rules
from tests.support.kube_emulator_schema import object_checker
from tests.support.kube_emulator_store import ObjectStore, ResourceRef

CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
_VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}


def check_crd(crd: dict) -> None:
    """The fields the API server requires of a CRD before it can serve its resource (422)."""
    spec = crd.get("spec")
    names = spec.get("names") if isinstance(spec, dict) else None
    if not isinstance(names, dict) or not names.get("plural") or not names.get("kind"):
        raise rules.invalid("spec.names.plural and spec.names.kind are required")
    if not spec.get("group") or spec.get("scope") not in ("Namespaced", "Cluster"):
        raise rules.invalid("spec.group is required; spec.scope must be Namespaced or Cluster")
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions or not all(
            isinstance(v, dict) and v.get("name") for v in versions):
        raise rules.invalid("spec.versions: at least one named version is required")
    if sum(bool(v.get("storage")) for v in versions) != 1:
        raise rules.invalid("spec.versions: exactly one version must be the storage version")
    if (crd.get("metadata") or {}).get("name") != f"{names['plural']}.{spec['group']}":
        raise rules.invalid(f"metadata.name: must be spec.names.plural+\".\"+spec.group: "
                            f"{names['plural']}.{spec['group']}")


def served_resources(crd: dict) -> dict[Any, kmock.ResourceInfo]:
    """The resources a CRD makes servable: one per `served` version, with its scope, names
    and subresources (`status`, `scale`) as discovery reports them."""
    spec, names = crd["spec"], crd["spec"]["names"]
    return {
        kmock.resource(spec["group"], version["name"], names["plural"]): kmock.ResourceInfo(
            kind=names["kind"], singular=names.get("singular") or names["kind"].lower(),
            namespaced=spec["scope"] == "Namespaced",
            shortnames=names.get("shortNames") or [], categories=names.get("categories") or [],
            subresources=set((version.get("subresources") or {}).keys()), verbs=_VERBS)
        for version in spec["versions"] if version.get("served", True)
    }


def established_status(crd: dict) -> dict:
    """The status the API server's CRD controllers write once names are accepted."""
    spec = crd["spec"]
    conditions = [{"type": kind, "status": "True", "reason": reason, "message": message,
                   "lastTransitionTime": rules.now_rfc3339()}
                  for kind, reason, message in (
                      ("NamesAccepted", "NoConflicts", "no conflicts found"),
                      ("Established", "InitialNamesAccepted", "the initial names have been accepted"))]
    return {"conditions": conditions, "acceptedNames": spec["names"],
            "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")]}


def schema_of(crd: dict, version: str) -> dict | None:
    """The structural schema of one version (pruning, defaulting and validation use it)."""
    for entry in crd["spec"]["versions"]:
        if entry.get("name") == version:
            return ((entry.get("schema") or {}).get("openAPIV3Schema")) or None
    return None


class CrdRegistry:
    """Keeps the emulator's served resources in step with the stored CRDs."""

    def __init__(self, resources: kmock.ResourcesArray, store: ObjectStore) -> None:
        self.resources, self.store = resources, store
        self.served: dict[str, set[ResourceRef]] = {}  # by CRD name
        store.validators[CRDS] = check_crd
        store.on_hard_delete.append(self._forget)

    def is_custom(self, resource: ResourceRef) -> bool:
        return any(resource in served for served in self.served.values())

    def sync(self, name: str) -> dict | None:
        """Serve what a created or updated CRD declares, and no longer what it dropped (their
        objects stay stored, as they stay in etcd). A new CRD is established at once, as the
        API server's CRD controllers do within moments. Returns the CRD if that changed it."""
        crd = self.store.find(CRDS, None, name)
        if crd is None:
            return None
        wanted = served_resources(crd)
        for resource in self.served.pop(name, set()) - set(wanted):
            del self.resources[resource]
            self.store.validators.pop(resource, None)
        for resource, info in wanted.items():
            self.resources[resource] = info
            schema = schema_of(crd, resource.version)
            if schema is not None:
                self.store.validators[resource] = object_checker(schema)
        self.served[name] = set(wanted)
        if not (crd.get("status") or {}).get("conditions"):
            return self.store.set_status(CRDS, None, name, established_status(crd))
        return None

    def _forget(self, resource: ResourceRef, obj: dict) -> None:
        if resource != CRDS:
            return
        for gone in self.served.pop(obj["metadata"]["name"], set()):
            del self.resources[gone]
            self.store.validators.pop(gone, None)
            self.store.drop_resource(gone)
