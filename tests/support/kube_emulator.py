"""A Kubernetes API server for fast tests: KMock's `KubernetesEmulator` plus what kopf 1.45 and
the official `kubernetes` client need from a real kube-apiserver. Where a test asserts how
Kubernetes itself behaves (RBAC, Pod Security and other admission, garbage collection, the
controllers, schema and CEL validation as kubectl reports it), it runs on the real control plane
instead (tests/cluster, tests/support/controlplane.py); this emulator is for speed.

KMock 0.8 keeps objects as plain JSON and lacks much of the API server's behaviour. This subclass keeps KMock's discovery, request log, object history and
reactions (failure injection: a test's reaction is served before the emulator's own), and
replaces its object verbs with ones that follow the real API server:

* create answers 201 and sets metadata.namespace/uid/resourceVersion/creationTimestamp/
  generation; `generateName` makes a name; duplicates are 409 AlreadyExists; bad bodies are
  400/422 with a message and store nothing.
* one global resourceVersion counter (etcd's revision): every write bumps it, a no-op write
  does not; lists carry it, with `kind: <Kind>List` and `apiVersion`.
* `labelSelector` and `fieldSelector` filter lists, watches and delete-collection.
* PATCH in its three flavours (JSON patch, merge patch, strategic merge patch for built-in
  kinds; 415 for strategic merge on custom resources) and server-side apply (creates a missing
  object, else merges: field ownership is not emulated); a failed JSON-patch `test` is 422.
* PUT replaces the object; a stale `metadata.resourceVersion` (PUT, PATCH, scale, or a DELETE
  precondition) is 409 Conflict.
* resource quantities of pods and pod templates are stored canonicalised (`cpu: 1000m` reads
  back as "1"; kube_emulator_quantities.py).
* the `status` subresource split: on a kind that has it, create and the main endpoint ignore
  `.status` and `/status` changes only `.status`; `generation` bumps only when the spec part
  changes. The `scale` subresource of built-in workloads reads and writes spec.replicas.
* deletion: finalizers hold an object with `deletionTimestamp` until they are removed (no new
  ones may be added meanwhile); then the garbage collector deletes (background cascade) or
  orphans (`propagationPolicy=Orphan`) the objects whose ownerReferences point at it, at once.
  DELETE answers with the object or a Status, per kind, as the real registries do.
* watch (kube_emulator_watch.py): `application/json` line stream honouring `timeoutSeconds`,
  `resourceVersion` (unset/"0": current state as ADDED, then changes; N: every change after
  N), selectors (an object leaving the selection is DELETED, entering it is ADDED),
  namespaced, cluster-wide or on one object's URL.
* a created CustomResourceDefinition (kube_emulator_crds.py) registers its served versions
  (scope, plural, kind, short names, categories, subresources) and gets Established and
  NamesAccepted conditions; updating it updates discovery; deleting it unregisters them and
  drops their objects. Custom objects are pruned, defaulted and validated (422) against the
  version's structural schema (kube_emulator_schema.py; CEL rules are not evaluated).
* discovery: trailing slashes (`/apis/`, `/apis/apps/`), core group version "v1",
  `/api` with serverAddressByClientCIDRs, versions ordered GA > beta > alpha;
  `/api/v1/namespaces` and `/api/v1/namespaces/<name>` as the `namespaces` resource;
  `/version` is v1.37.0 (the pinned tooling's release); `/openapi/v3` as far as client-go
  reads it before writing (kube_emulator_openapi.py), so Helm 4 install/upgrade/uninstall work.

Not emulated (tests act as these): controllers (a StatefulSet makes no pods; an opt-in
EndpointSlice controller is in kube_emulator_endpoints.py), scheduling, kubelet (pods are
deleted at once), namespace lifecycle (any namespace name is accepted; deleting one deletes
nothing else), authentication and authorisation (every request is the admin's), admission,
built-in kinds' defaulting and validation, pagination,
bookmarks, foreground cascading (treated as background), one storage shared by several
versions of a resource, the `scale` subresource of custom resources.
"""
from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import parsing, rendering

from tests.support import kube_emulator_quantities as quantities
from tests.support import kube_emulator_rules as rules
from tests.support.kube_emulator_crds import CRDS, CrdRegistry
from tests.support.kube_emulator_openapi import openapi_group_version, openapi_root
from tests.support.kube_emulator_schema import FIELD_VALIDATION
from tests.support.kube_emulator_store import ObjectStore, ResourceRef
from tests.support.kube_emulator_watch import close_all_watches, open_watch

_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+)(?:/(?P<sub>status|finalize))?)?/?$")


# Kinds whose DELETE answers with the object, not a Status (returnDeletedObject in their
# registries; the official client deserializes these into the typed model).
_RETURNS_DELETED_OBJECT = frozenset({
    "pods", "services", "serviceaccounts", "persistentvolumeclaims", "persistentvolumes",
    "resourcequotas", "podtemplates", "csidrivers", "csinodes", "storageclasses",
    "volumeattachments", "volumeattributesclasses", "deviceclasses", "resourceclaims",
    "resourceclaimtemplates", "resourceslices"})


def _status_body(status: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": {}, "code": status}


def _parse_path(path: str) -> parsing.ParsedPath:
    # KMock reads `/api/v1/namespaces/<x>` as a namespace with no resource and fails on the bare
    # collection; the API server serves both as the cluster-scoped resource `namespaces`.
    if m := _NAMESPACE_PATH.match(path):
        return parsing.ParsedPath("", "v1", "namespaces", None, m["name"], m["sub"])
    return parsing.parse_path(path)


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """The emulator. Serve it with `kmock.Server`; `store` holds the objects."""

    store: ObjectStore = attrs.field(init=False)
    crds: CrdRegistry = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # Keep KMock's discovery and error rendering but none of its object verbs: all requests
        # for a resource go to one dispatcher (user reactions, if any, still come first).
        kmock.KubernetesScaffold.__attrs_post_init__(self)
        self.store = ObjectStore(self._objects, self._info)
        for workload in quantities.WORKLOADS:   # stored canonicalised, as kube-apiserver does
            self.store.validators[workload] = quantities.canonicalise_workload
        self.crds = CrdRegistry(self.resources, self.store)
        self.fallback["get /openapi/v3"] << (lambda: openapi_root(self._resources._resources))
        self.fallback["get", re.compile(r"/openapi/v3/.+")] << self._serve_openapi
        self.fallback[lambda request: request.resource is not None
                      and request.resource.plural is not None] << self._serve_resource

    @property
    def requests(self) -> list[rendering.Request]:
        """The requests served so far, oldest first (a copy: safe from the test's thread)."""
        return list(self._requests)

    # --- HTTP plumbing ------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # As RawHandler.__call__, but with a request parser that knows `/api/v1/namespaces`.
        body = await raw_request.read()
        started: aiohttp.web.StreamResponse | None = None
        try:
            request = self._parse_request(raw_request, body)
            self._requests.append(request)
            try:
                return await self._handle(request)
            except rendering.StreamingError as exc:
                started = exc.args[0]
                raise exc.__cause__ or exc  # noqa: B904 - the handler's own error, as it raised it
        except Exception as exc:
            if not self._errors:
                raise
            self._errors[-1].append(exc)
            if started is None or not started.prepared:
                return await self._render_error(exc)
            await self._stream_error(exc, started)  # too late for a status: an ERROR event
            await started.write_eof()
            return started

    def _parse_request(self, raw_request: aiohttp.web.BaseRequest, body: bytes) -> rendering.Request:
        k8s = _parse_path(raw_request.path)
        resource = None if k8s.group is None else kmock.resource(
            group=k8s.group, version=k8s.version, plural=k8s.plural)
        text = body.decode("utf-8", errors="replace")
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        # kube-apiserver serves `/apis/apps/` as `/apis/apps` (client-go and the official
        # client's get_api_group() use the slash); KMock's path patterns are exact.
        url = raw_request.url
        if len(url.path) > 1 and url.path.endswith("/"):
            url = url.with_path(url.path.rstrip("/"))
        return rendering.Request(
            id=len(self._requests), raw_request=raw_request, url=url,
            method=raw_request.method, params=dict(raw_request.query),
            headers=dict(raw_request.headers), cookies=dict(raw_request.cookies),
            data=data, body=body, text=text,
            action=parsing.guess_k8s(k8s, kmock.method(raw_request.method), dict(raw_request.query)),
            resource=resource, namespace=k8s.namespace, name=k8s.name, subresource=k8s.subresource,
        )

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        # A Status as kube-apiserver sends it; KMock's traceback stays only for real failures.
        if isinstance(exc, kmock.KubernetesError):
            return aiohttp.web.json_response(_status_body(
                exc.status, exc.reason or type(exc).__name__, exc.message or repr(exc)),
                status=exc.status)
        return await super()._render_error(exc)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        # Skip KubernetesEmulator._handle: it mutates objects before dispatch, the KMock way.
        return await kmock.RawHandler._handle(self, request)

    # --- discovery ----------------------------------------------------------------------------

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_version(request)
        if request.resource is not None and request.resource.group == "":
            payload["groupVersion"] = request.resource.version  # core is "v1", not "/v1"
        for entry in payload["resources"]:
            entry["verbs"] = sorted(entry["verbs"])
            if "/" in entry["name"]:  # subresources: their own verbs, no short names
                entry.update(verbs=["get", "patch", "update"], shortNames=[], categories=[])
        return payload

    async def _serve_apis(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_apis(request)
        for group in payload["groups"]:
            rules.prefer_stable_versions(group)
        return payload

    async def _serve_group(self, request: rendering.Request) -> rendering.Payload:
        return rules.prefer_stable_versions(await super()._serve_group(request))

    async def _serve_openapi(self, request: rendering.Request) -> rendering.Payload:
        k8s = _parse_path(request.url.path.removeprefix("/openapi/v3"))
        doc = None if k8s.group is None else openapi_group_version(
            self._resources._resources, k8s.group, k8s.version)
        if doc is None:
            raise kmock.KubernetesNotFoundError()
        return doc

    async def _serve_server_version(self, request: rendering.Request) -> rendering.Payload:
        # The release the pinned tooling targets (kubernetes client 37, kubernetes-validate
        # 1.37); KMock reports k3s 1.26, which charts with `kubeVersion: >=1.30` refuse.
        return {"major": "1", "minor": "37", "gitVersion": "v1.37.0", "gitCommit": "emulated",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64"}

    async def _serve_api(self, request: rendering.Request) -> rendering.Payload:
        # The official client's model requires serverAddressByClientCIDRs in APIVersions.
        host = request.url.host or "127.0.0.1"
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{host}:{request.url.port}"}]}

    def _info(self, resource: ResourceRef) -> kmock.ResourceInfo | None:
        return self._resources._resources.get(resource)

    # --- object requests ----------------------------------------------------------------------

    async def _serve_resource(self, request: rendering.Request) -> rendering.Response:
        validation = FIELD_VALIDATION.set(request.params.get("fieldValidation", ""))
        try:
            status, payload = self._dispatch(request)
            if request.resource == CRDS and request.method in ("POST", "PUT", "PATCH") \
                    and "dryRun" not in request.params:
                payload = self.crds.sync(payload["metadata"]["name"]) or payload
        except rules.ApiRuleError as exc:
            status, payload = exc.status, _status_body(exc.status, exc.reason, exc.message)
        finally:
            FIELD_VALIDATION.reset(validation)
        if isinstance(payload, AsyncIterator):
            return rendering.Response(status=status, payload=payload,
                                      headers={"Content-Type": "application/json"})
        return rendering.Response(status=status, payload=payload)

    def _dispatch(self, request: rendering.Request) -> tuple[int, Any]:
        resource, store, params = request.resource, self.store, request.params
        info = self._info(resource)
        if info is None:
            raise rules.ApiRuleError(404, "NotFound", "the server could not find the requested "
                                     f"resource ({resource.group}/{resource.version}/{resource.plural})")
        if info.namespaced and request.namespace is None and request.name is not None:
            raise rules.ApiRuleError(404, "NotFound", f"{resource.plural} are namespaced: the URL "
                                     "needs /namespaces/<namespace>/")
        if not info.namespaced and request.namespace is not None:
            raise rules.ApiRuleError(404, "NotFound", f"{resource.plural} are not namespaced")
        sub = request.subresource
        if sub not in (None, "status", "scale") or (sub == "scale" and self.crds.is_custom(resource)):
            raise rules.ApiRuleError(404, "NotFound", f"subresource {sub!r} is not emulated")
        if sub is not None and sub not in info.subresources:
            raise rules.ApiRuleError(404, "NotFound", f"{resource.plural} has no {sub} subresource")
        dry_run = "dryRun" in params
        method, name, ns = request.method, request.name, request.namespace

        if sub == "scale" and name is not None:
            return self._scale(request, resource, ns, name)
        if method == "GET" and params.get("watch") in ("true", "1"):
            by_query = self._selector(request)
            selector = by_query if name is None else (  # a watch on one object's URL
                lambda obj: obj["metadata"]["name"] == name and by_query(obj))
            transport = request._raw_request.transport if request._raw_request else None
            return 200, open_watch(store, resource, ns, selector, params,
                                   lambda: transport is None or transport.is_closing())
        if method == "GET" and name is None:
            return 200, store.list(resource, ns, self._selector(request))
        if method == "GET":
            return 200, store.get(resource, ns, name)
        if method == "POST" and name is None:
            if info.namespaced and ns is None:
                raise rules.ApiRuleError(405, "MethodNotAllowed", "POST needs a namespace in the URL")
            return 201, store.create(resource, ns, self._typed_body(request, info), dry_run=dry_run)
        if method == "PUT" and name is not None:
            body = self._typed_body(request, info)
            return 200, store.replace(resource, ns, name, body, status_only=sub == "status",
                                      dry_run=dry_run)
        if method == "PATCH" and name is not None:
            return self._patch(request, resource, ns, name)
        if method == "DELETE":
            options = request.data if isinstance(request.data, dict) else {}
            policy = params.get("propagationPolicy") or options.get("propagationPolicy")
            if name is None:
                return 200, store.delete_collection(resource, ns, self._selector(request), policy)
            deleted, immediately = store.delete(resource, ns, name, options.get("preconditions"),
                                                policy, dry_run=dry_run)
            if immediately and not self.crds.is_custom(resource) and \
                    resource.plural not in _RETURNS_DELETED_OBJECT:
                return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                             "status": "Success", "details": {
                                 "name": name, "group": resource.group, "kind": resource.plural,
                                 "uid": deleted["metadata"]["uid"]}}
            return 200, deleted
        raise rules.ApiRuleError(405, "MethodNotAllowed", f"{method} is not allowed here")

    def _patch(self, request: rendering.Request, resource: Any, ns: str | None,
               name: str) -> tuple[int, Any]:
        custom, dry_run = self.crds.is_custom(resource), "dryRun" in request.params
        change, body = self._patch_function(request, custom)
        if body is not None and self.store.find(resource, ns, name) is None:
            body.setdefault("metadata", {})["name"] = name  # server-side apply creates
            return 201, self.store.create(resource, ns, body, dry_run=dry_run)
        return 200, self.store.patch(resource, ns, name, change, dry_run=dry_run,
                                     status_only=request.subresource == "status")

    def _patch_function(self, request: rendering.Request,
                        custom: bool) -> tuple[Callable[[dict], Any], dict | None]:
        """The change a PATCH makes, by its content type; and the applied object for
        server-side apply (which creates a missing object)."""
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type == "application/json-patch+json":
            operations = self._body(request, list)
            return lambda obj: rules.json_patch(obj, operations), None
        if content_type == "application/merge-patch+json":
            merge = self._body(request, dict)
            return lambda obj: rules.merge_patch(obj, merge), None
        if content_type == "application/strategic-merge-patch+json" and not custom:
            strategic = self._body(request, dict)
            if request.resource.plural in rules.ATOMIC_LIST_KINDS:   # no list of theirs merges by key
                return lambda obj: rules.merge_patch(obj, strategic), None
            return lambda obj: rules.strategic_merge(obj, strategic), None
        if content_type == "application/apply-patch+yaml":
            # Field ownership is not emulated: an apply merges like the matching patch.
            applied = self._yaml_body(request)
            merge_fn = rules.merge_patch if custom else rules.strategic_merge
            return lambda obj: merge_fn(obj, applied), applied
        raise rules.ApiRuleError(415, "UnsupportedMediaType", "the body of the request was in "
                                 f"an unknown format ({content_type!r}) - accepted media types "
                                 "include: application/json-patch+json, application/merge-patch"
                                 "+json, application/apply-patch+yaml" +
                                 ("" if custom else ", application/strategic-merge-patch+json"))

    def _scale(self, request: rendering.Request, resource: Any, ns: str | None,
               name: str) -> tuple[int, Any]:
        """The `scale` subresource of built-in workloads: an autoscaling/v1 Scale view whose
        writes change only spec.replicas (a resourceVersion in it is a precondition)."""
        current = self.store.get(resource, ns, name)
        if request.method == "GET":
            return 200, rules.scale_of(current)
        if request.method == "PUT":
            wanted = self._body(request, dict)
        elif request.method == "PATCH" and self._patch_function(request, False)[1] is None:
            wanted = self._patch_function(request, False)[0](rules.scale_of(current))
        else:
            raise rules.ApiRuleError(405, "MethodNotAllowed", f"{request.method} on scale")
        replicas = (wanted.get("spec") or {}).get("replicas") if isinstance(wanted, dict) else None
        if not isinstance(replicas, int) or replicas < 0:
            raise rules.invalid("spec.replicas: must be a non-negative integer")
        version = (wanted.get("metadata") or {}).get("resourceVersion")
        updated = self.store.patch(resource, ns, name, lambda obj: {
            **obj, "spec": {**(obj.get("spec") or {}), "replicas": replicas},
            "metadata": {**obj["metadata"], "resourceVersion": version}}, status_only=False,
            dry_run="dryRun" in request.params)
        return 200, rules.scale_of(updated)

    def _typed_body(self, request: rendering.Request, info: Any) -> dict:
        """A create or replace body. A custom object must say its kind: kube-apiserver decodes it
        by `kind`, not by the URL (built-in kinds are decoded by the URL)."""
        body = self._body(request, dict)
        if self.crds.is_custom(request.resource) and not body.get("kind"):
            raise rules.bad_request(f"the object provided is unrecognized (must be of type {info.kind}): "
                                    f"Object 'Kind' is missing in '{request.text}'")
        return body

    @staticmethod
    def _body(request: rendering.Request, kind: type) -> Any:
        try:
            data = json.loads(request.body)
        except ValueError as exc:
            raise rules.bad_request(f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(data, kind):
            raise rules.bad_request(f"the request body must be a JSON {kind.__name__}")
        return data

    @staticmethod
    def _yaml_body(request: rendering.Request) -> dict:
        import yaml  # JSON is YAML too; apply patches come as either

        try:
            data = yaml.safe_load(request.text)
        except yaml.YAMLError as exc:
            raise rules.bad_request(f"the apply patch is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise rules.bad_request("the apply patch must be an object")
        return data

    @staticmethod
    def _selector(request: rendering.Request) -> Callable[[dict], bool]:
        labels = rules.parse_label_selector(request.params.get("labelSelector"))
        fields = rules.parse_field_selector(request.params.get("fieldSelector"))
        return lambda obj: labels(obj) and fields(obj)

    def close_watches(self) -> None:
        """End every open watch (as an API server does on shutdown), so the server stops fast."""
        close_all_watches(self.store)
