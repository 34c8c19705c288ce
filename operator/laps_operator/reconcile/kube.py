"""A small JSON-in, JSON-out layer over the official `kubernetes` client's ApiClient.

The generated typed APIs want typed models per kind; the operator's builders produce plain
manifests of many kinds, so this talks REST by path while keeping the official client's
configuration, authentication and TLS.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import kubernetes

from laps_operator.naming import KIND, PLURAL

# kind -> (plural, namespaced). Everything the operator reads or writes.
PLURALS: dict[str, tuple[str, bool]] = {
    "ConfigMap": ("configmaps", True),
    "Service": ("services", True),
    "ServiceAccount": ("serviceaccounts", True),
    "Pod": ("pods", True),
    "Event": ("events", True),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "StatefulSet": ("statefulsets", True),
    "Deployment": ("deployments", True),
    "PodMonitor": ("podmonitors", True),
    "NetworkPolicy": ("networkpolicies", True),
    KIND: (PLURAL, True),
}

MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Ref:
    api_version: str
    kind: str
    namespace: str
    name: str | None = None

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> Ref:
        meta = manifest["metadata"]
        return cls(manifest["apiVersion"], manifest["kind"], meta.get("namespace", ""), meta.get("name"))

    def path(self) -> str:
        plural, namespaced = PLURALS[self.kind]
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if namespaced:
            base += f"/namespaces/{self.namespace}"
        base += f"/{plural}"
        return f"{base}/{self.name}" if self.name else base

    def collection(self) -> Ref:
        return Ref(self.api_version, self.kind, self.namespace)


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient | None = None):
        self.api = api_client or kubernetes.client.ApiClient()

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None,
                content_type: str = "application/json") -> dict[str, Any] | None:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, body, post = self.api.param_serialize(
            method, path, query_params=list((query or {}).items()), header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, header_params=headers, body=body, post_params=post,
                                     _request_timeout=30)
        raw = response.read()
        if response.status >= 400:
            raise KubeError(response.status, _message(raw))
        return json.loads(raw) if raw else None

    def get(self, ref: Ref) -> dict[str, Any] | None:
        try:
            return self.request("GET", ref.path())
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, ref: Ref, label_selector: dict[str, str] | None = None,
             field_selector: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Objects of a collection; `field_selector`: dotted field paths to values (Events:
        `involvedObject.name`...)."""
        query: dict[str, str] = {}
        if label_selector:
            query["labelSelector"] = ",".join(f"{k}={v}" for k, v in label_selector.items())
        if field_selector:
            query["fieldSelector"] = ",".join(f"{k}={v}" for k, v in field_selector.items())
        items = (self.request("GET", ref.path(), query=query or None) or {}).get("items") or []
        # Filter here too: a server (or emulator) that ignores a selector must not widen it.
        if label_selector:
            items = [i for i in items if _has_labels(i, label_selector)]
        if field_selector:
            items = [i for i in items if all(field_value(i, k) == v for k, v in field_selector.items())]
        return items

    def create(self, manifest: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any] | None:
        """`dry_run`: validated and admitted (webhooks included) as a write, never stored."""
        return self.request("POST", Ref.of(manifest).collection().path(), manifest, query=_dry(dry_run))

    def patch(self, ref: Ref, patch: dict[str, Any], *, subresource: str = "",
              dry_run: bool = False) -> dict[str, Any] | None:
        path = ref.path() + (f"/{subresource}" if subresource else "")
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH, query=_dry(dry_run))

    def delete(self, ref: Ref) -> bool:
        try:
            self.request("DELETE", ref.path())
            return True
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise


def _dry(dry_run: bool) -> dict[str, str] | None:
    return {"dryRun": "All"} if dry_run else None


def _has_labels(obj: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def field_value(obj: dict[str, Any], path: str) -> str:
    """The value at a field selector's dotted path, as the selector compares it ("" if absent)."""
    for key in path.split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def _message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:500]
    return str(body.get("message") or body) if isinstance(body, dict) else str(body)
