"""The slice of kube-apiserver's OpenAPI v3 that client-go (Helm 4, kubectl) reads before it
writes: per group-version documents whose PATCH operations carry the GVK extension and the
`fieldValidation` query parameter. Seeing that, client-go leaves validation to the server
(`?fieldValidation=Strict`) instead of fetching the full schemas. Schemas are not served."""
from __future__ import annotations

from typing import Any

_FIELD_VALIDATION = {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}


def _prefix(group: str, version: str) -> str:
    return f"api/{version}" if group == "" else f"apis/{group}/{version}"


def openapi_root(resources: dict[Any, Any]) -> dict:
    """`GET /openapi/v3`: where each group-version's document is."""
    versions = {(r.group, r.version) for r in resources}
    return {"paths": {_prefix(g, v): {"serverRelativeURL": f"/openapi/v3/{_prefix(g, v)}"}
                      for g, v in sorted(versions)}}


def openapi_group_version(resources: dict[Any, Any], group: str, version: str) -> dict | None:
    """`GET /openapi/v3/apis/<group>/<version>`: PATCH operations of its resources."""
    paths = {}
    for resource, info in resources.items():
        if (resource.group, resource.version) != (group, version) or info.kind is None:
            continue
        scope = "/namespaces/{namespace}" if info.namespaced else ""
        path = f"/{_prefix(group, version)}{scope}/{resource.plural}/{{name}}"
        paths[path] = {"patch": {
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": info.kind},
            "parameters": [_FIELD_VALIDATION]}}
    if not paths:
        return None
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.37.0"},
            "paths": paths, "components": {"schemas": {}}}
