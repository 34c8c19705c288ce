"""Object storage of the Kubernetes API emulator: the write rules of a real API server.

Objects live in KMock's `ObjectsArray` (so `emulator.objects[...]` and its per-object history
still work for assertions); this module decides what a write does to them. Everything runs on
the emulator's event loop with no await inside a write, so each write is atomic.
"""
from __future__ import annotations

import asyncio
import copy
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kmock

from tests.support import kube_emulator_rules as rules

ResourceRef = Any  # kmock.resource: group, version, plural
Selector = Callable[[dict], bool]
# Metadata only the server sets; a client's write never changes these.
_SERVER_METADATA = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                    "deletionGracePeriodSeconds", "generation", "resourceVersion")


def _meta(obj: dict) -> dict:
    return obj.setdefault("metadata", {})


def _spec_part(obj: dict, status_is_separate: bool) -> dict:
    """What `metadata.generation` tracks: all but metadata (and status, if it is separate)."""
    skipped = {"metadata", "apiVersion", "kind"} | ({"status"} if status_is_separate else set())
    return {k: v for k, v in obj.items() if k not in skipped}


class WatchExpired(Exception):
    """A watch asked for history that compaction removed (the API server's 410 Expired)."""


@dataclass(frozen=True)
class WatchEvent:
    """One change, kept so that a watch from an older resourceVersion can replay it."""
    revision: int
    type: str            # ADDED | MODIFIED | DELETED
    old: dict | None     # the state before (the last state, for DELETED)
    new: dict | None     # the state after (None for DELETED)

    def as_seen_by(self, namespace: str | None, selector: Selector) -> dict | None:
        """The event a watch with these filters gets: objects moving out of the selection are
        DELETED for it, objects moving in are ADDED, as the API server's watch cache does."""
        def visible(obj: dict | None) -> bool:
            return obj is not None and selector(obj) and (
                namespace is None or obj["metadata"].get("namespace") == namespace)

        was, now = visible(self.old), visible(self.new)
        if self.type == "DELETED":
            return {"type": "DELETED", "object": self.old} if was else None
        if now:
            return {"type": "MODIFIED" if was else "ADDED", "object": self.new}
        if was:
            return {"type": "DELETED", "object": self.new}
        return None


class ObjectStore:
    def __init__(self, objects: kmock.ObjectsArray,
                 info: Callable[[ResourceRef], kmock.ResourceInfo | None]) -> None:
        self.objects = objects
        self._info = info
        self.revision = 0  # etcd's revision: one counter for all objects
        self.compacted = 0  # history before this revision is gone (see compact())
        self.events: dict[ResourceRef, list[WatchEvent]] = defaultdict(list)
        self.watchers: dict[ResourceRef, set[asyncio.Queue]] = defaultdict(set)
        self.on_hard_delete: list[Callable[[ResourceRef, dict], None]] = []
        # Called after every stored change (e.g. by opt-in controllers).
        self.after_commit: list[Callable[[ResourceRef, WatchEvent], None]] = []
        # Per-resource checks of a would-be stored object (as validation in the API server).
        self.validators: dict[ResourceRef, Callable[[dict], None]] = {}

    # --- reads --------------------------------------------------------------------------------

    def find(self, resource: ResourceRef, namespace: str | None, name: str) -> dict | None:
        key = (resource, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def get(self, resource: ResourceRef, namespace: str | None, name: str) -> dict:
        obj = self.find(resource, namespace, name)
        if obj is None:
            raise rules.ApiRuleError(404, "NotFound", f'{resource.plural} "{name}" not found')
        return obj

    def _live(self, resource: ResourceRef, namespace: str | None) -> list[dict]:
        found = [obj.raw for (res, ns, _), obj in self.objects.items()
                 if res == resource and not obj.deleted and (namespace is None or ns == namespace)]
        return sorted(found, key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))

    def list(self, resource: ResourceRef, namespace: str | None, selector: Selector) -> dict:
        info = self._info(resource)
        return {
            "apiVersion": self._api_version(resource), "kind": f"{info.kind}List",
            "metadata": {"resourceVersion": str(self.revision)},
            "items": [copy.deepcopy(o) for o in self._live(resource, namespace) if selector(o)],
        }

    # --- writes -------------------------------------------------------------------------------

    def create(self, resource: ResourceRef, namespace: str | None, body: dict, *,
               dry_run: bool = False) -> dict:
        info = self._info(resource)
        obj = copy.deepcopy(body)
        self._check_type(resource, obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if meta.get("resourceVersion"):
            raise rules.bad_request("resourceVersion should not be set on objects to be created")
        if info.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise rules.bad_request("the namespace of the provided object does not match "
                                        "the namespace sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise rules.invalid("metadata.name: Required value: name or generateName is required")
            meta["name"] = rules.generate_name(meta["generateName"])
            while self.find(resource, namespace, meta["name"]) is not None:
                meta["name"] = rules.generate_name(meta["generateName"])
        rules.check_object_name(meta["name"])
        if (resource, namespace, meta["name"]) in self.objects and \
                not self.objects[resource, namespace, meta["name"]].deleted:
            raise rules.ApiRuleError(409, "AlreadyExists",
                                     f'{resource.plural} "{meta["name"]}" already exists')
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=rules.now_rfc3339(), generation=1)
        if "status" in info.subresources:
            obj.pop("status", None)  # status is written through /status only
        self._validate(resource, obj)
        if not dry_run:
            self._commit(resource, "ADDED", None, obj)
        return copy.deepcopy(obj)

    def replace(self, resource: ResourceRef, namespace: str | None, name: str, body: dict, *,
                status_only: bool, dry_run: bool = False) -> dict:
        self._check_type(resource, body)
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise rules.bad_request("the name of the object does not match the name on the URL")
        return self.patch(resource, namespace, name, lambda _: copy.deepcopy(body),
                          status_only=status_only, dry_run=dry_run)

    def patch(self, resource: ResourceRef, namespace: str | None, name: str,
              change: Callable[[dict], Any], *, status_only: bool, dry_run: bool = False) -> dict:
        old = self.get(resource, namespace, name)
        candidate = change(copy.deepcopy(old))
        if not isinstance(candidate, dict):
            raise rules.invalid("the patched object is not an object")
        self._check_type(resource, candidate)
        wanted_version = (candidate.get("metadata") or {}).get("resourceVersion")
        if wanted_version and wanted_version != old["metadata"]["resourceVersion"]:
            raise rules.ApiRuleError(409, "Conflict", f'Operation cannot be fulfilled on '
                                     f'{resource.plural} "{name}": the object has been modified; '
                                     "please apply your changes to the latest version and try again")
        status_is_separate = "status" in self._info(resource).subresources
        if status_only:
            new = copy.deepcopy(old)
            new.pop("status", None)
            if candidate.get("status") is not None:
                new["status"] = candidate["status"]
        else:
            new = candidate
            if not isinstance(new.get("metadata"), dict):
                new["metadata"] = {}
            for field in _SERVER_METADATA:
                new["metadata"].pop(field, None)
                if field in old["metadata"]:
                    new["metadata"][field] = old["metadata"][field]
            if status_is_separate:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = old["status"]
        new.setdefault("apiVersion", old["apiVersion"])
        new.setdefault("kind", old["kind"])
        added = set(new["metadata"].get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
        if old["metadata"].get("deletionTimestamp") and added:
            raise rules.invalid(f"metadata.finalizers: Forbidden: no new finalizers can be added "
                                f"if the object is being deleted, found new finalizers {sorted(added)}")
        self._validate(resource, new)
        if new == old:
            return old  # a no-op write changes no resourceVersion and sends no event
        if _spec_part(new, status_is_separate) != _spec_part(old, status_is_separate):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if dry_run:
            return new
        self._commit(resource, "MODIFIED", old, new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return self._remove(resource, new, policy=None)
        return copy.deepcopy(new)

    def set_status(self, resource: ResourceRef, namespace: str | None, name: str, status: dict) -> dict:
        """A write by a server-side controller (e.g. the CRD establishing controller)."""
        return self.patch(resource, namespace, name, lambda obj: {**obj, "status": status},
                          status_only=True)

    def delete(self, resource: ResourceRef, namespace: str | None, name: str,
               preconditions: dict | None = None, policy: str | None = None, *,
               dry_run: bool = False) -> tuple[dict, bool]:
        """Returns the object and whether it is gone (False: finalizers hold it)."""
        obj = self.get(resource, namespace, name)
        for field in ("uid", "resourceVersion"):
            wanted = (preconditions or {}).get(field)
            if wanted and wanted != obj["metadata"].get(field):
                raise rules.ApiRuleError(409, "Conflict", f"Precondition failed: {field} in "
                                         f"precondition: {wanted}, {field} in object meta: "
                                         f"{obj['metadata'].get(field)}")
        if dry_run:
            return obj, not obj["metadata"].get("finalizers")
        if obj["metadata"].get("finalizers"):
            if obj["metadata"].get("deletionTimestamp"):
                return obj, False
            new = copy.deepcopy(obj)
            new["metadata"]["deletionTimestamp"] = rules.now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
            self._commit(resource, "MODIFIED", obj, new)
            return copy.deepcopy(new), False
        return self._remove(resource, obj, policy), True

    def delete_collection(self, resource: ResourceRef, namespace: str | None, selector: Selector,
                          policy: str | None) -> dict:
        listing = self.list(resource, namespace, selector)
        listing["items"] = [self.delete(resource, o["metadata"].get("namespace"), o["metadata"]["name"],
                                        policy=policy)[0] for o in listing["items"]]
        return listing

    def drop_resource(self, resource: ResourceRef) -> None:
        """Objects of a resource whose CRD is deleted disappear with it."""
        for key in [k for k in self.objects if k[0] == resource]:
            del self.objects[key]
        self.events.pop(resource, None)

    # --- watch support ------------------------------------------------------------------------

    def subscribe(self, resource: ResourceRef, queue: asyncio.Queue, since: int) -> list[WatchEvent]:
        """Register a watcher; return what it must see first: the current objects as ADDED when
        `since` is 0 (resourceVersion unset or "0"), else every change after `since`."""
        if 0 < since < self.compacted:
            raise WatchExpired(f"too old resource version: {since} ({self.compacted})")
        self.watchers[resource].add(queue)
        if since == 0:
            return [WatchEvent(self.revision, "ADDED", None, copy.deepcopy(o))
                    for o in self._live(resource, None)]
        return [e for e in self.events[resource] if e.revision > since]

    def compact(self) -> int:
        """Forget the change history up to now, as etcd compaction does: a watch from an older
        resourceVersion then gets 410 Expired and the client must list again."""
        self.compacted = self.revision
        self.events.clear()
        return self.compacted

    def unsubscribe(self, resource: ResourceRef, queue: asyncio.Queue) -> None:
        self.watchers[resource].discard(queue)

    # --- internals ----------------------------------------------------------------------------

    def _api_version(self, resource: ResourceRef) -> str:
        return f"{resource.group}/{resource.version}" if resource.group else resource.version

    def _validate(self, resource: ResourceRef, obj: dict) -> None:
        if (validator := self.validators.get(resource)) is not None:
            validator(obj)

    def _check_type(self, resource: ResourceRef, obj: dict) -> None:
        expected_kind, api_version = self._info(resource).kind, self._api_version(resource)
        if obj.get("kind") not in (None, expected_kind) or obj.get("apiVersion") not in (None, api_version):
            raise rules.bad_request(f"the object provided is unrecognized (must be of type "
                                    f"{expected_kind}, {api_version}): got {obj.get('kind')}, "
                                    f"{obj.get('apiVersion')}")
        obj["apiVersion"], obj["kind"] = api_version, expected_kind

    def _commit(self, resource: ResourceRef, kind: str, old: dict | None, new: dict | None) -> None:
        self.revision += 1
        target = new if new is not None else old
        _meta(target)["resourceVersion"] = str(self.revision)
        key = (resource, target["metadata"].get("namespace"), target["metadata"]["name"])
        if new is None:
            self.objects[key].delete()
        elif key in self.objects:
            self.objects[key].history.append(copy.deepcopy(new))
        else:
            self.objects[key] = copy.deepcopy(new)
        event = WatchEvent(self.revision, kind, copy.deepcopy(old), copy.deepcopy(new))
        self.events[resource].append(event)
        for queue in self.watchers[resource]:
            queue.put_nowait(event)
        for hook in self.after_commit:
            hook(resource, event)

    def _remove(self, resource: ResourceRef, obj: dict, policy: str | None) -> dict:
        last = copy.deepcopy(obj)
        self._commit(resource, "DELETED", last, None)
        for hook in self.on_hard_delete:
            hook(resource, last)
        self._collect_garbage(last["metadata"]["uid"], orphan=policy == "Orphan")
        return copy.deepcopy(last)

    def _collect_garbage(self, owner_uid: str, *, orphan: bool) -> None:
        """The garbage collector: dependents of a deleted owner are deleted (background
        cascade) unless orphaned, or unless another owner of theirs still exists."""
        live = {key: obj.raw for key, obj in self.objects.items() if not obj.deleted}
        live_uids = {obj["metadata"].get("uid") for obj in live.values()}
        for (resource, namespace, name), obj in live.items():
            refs = obj["metadata"].get("ownerReferences") or []
            if not any(ref.get("uid") == owner_uid for ref in refs):
                continue
            if self.find(resource, namespace, name) is None:
                continue  # already gone through an earlier cascade
            others_alive = any(ref.get("uid") in live_uids for ref in refs if ref.get("uid") != owner_uid)
            if orphan or others_alive:
                kept = [ref for ref in refs if ref.get("uid") != owner_uid]
                self.patch(resource, namespace, name,
                           lambda o, kept=kept: {**o, "metadata": {**o["metadata"], "ownerReferences": kept}},
                           status_only=False)
            else:
                self.delete(resource, namespace, name)
