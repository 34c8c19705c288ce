"""Writing the children: `apply_all` sends the three-way patches of apply.py (or creates), all
of them tried as dry runs first, and says what the API server refused."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from laps_operator.reconcile.apply import LAST_APPLIED, last_applied_of, three_way_patch, with_last_applied
from laps_operator.reconcile.kube import Kube, KubeError, Ref

Action = Literal["created", "patched", "unchanged", "deleted", "skipped", "refused"]


@dataclass(frozen=True)
class Applied:
    ref: Ref
    action: Action
    detail: str = ""


class ChildRefused(KubeError):
    """The API server (or an admission policy) refuses a child as the spec renders it: most
    often a spec problem the operator's own checks missed; `immutable`: a field the server does
    not let change (an operator upgrade that renders a selector differently), which no spec
    edit fixes."""

    def __init__(self, ref: Ref, exc: KubeError, *, dry: bool, repair: bool = False):
        super().__init__(exc.status, exc.message)
        self.ref, self.dry, self.repair = ref, dry, repair
        self.immutable = exc.status == 422 and "field is immutable" in exc.message

    def __str__(self) -> str:
        if self.repair:
            said = (f"the API server refuses to bring {self.ref.kind}/{self.ref.name} back to the spec "
                    f"(left as it is, the other children applied): {self.message}")
        else:
            done = "no child was changed" if self.dry else "the children before it were applied"
            said = f"the API server refuses {self.ref.kind}/{self.ref.name} as this spec renders it ({done}): {self.message}"
        if self.immutable:
            said += (f"; delete {self.ref.kind}/{self.ref.name} with --cascade=orphan and the operator "
                     "creates it anew, its pods kept")
        return said


# What a refusal of the object itself answers: 422 Invalid, 400 BadRequest; 403 from admission
# ("admission webhook ... denied the request", "ValidatingAdmissionPolicy ... denied request"),
# not RBAC's 403.
def _refuses_the_object(exc: KubeError) -> bool:
    return exc.status in (400, 422) or (exc.status == 403 and (
        "denied the request" in exc.message or "denied request" in exc.message))


@dataclass
class _Write:
    ref: Ref
    desired: dict[str, Any]
    patch: dict[str, Any] | None   # None: create
    repair: bool = False           # puts back what was applied before: not this edit's


def _plan(kube: Kube, manifest: dict[str, Any], applied: bool = False) -> _Write | Applied:
    ref = Ref.of(manifest)
    desired = with_last_applied(manifest)
    live = kube.get(ref)
    if live is None:
        return _Write(ref, desired, None, repair=applied)
    patch = three_way_patch(last_applied_of(live), desired, live)
    if not patch:
        return Applied(ref, "unchanged")
    # The child renders as it did when last applied: the patch only undoes someone else's edit.
    said = desired["metadata"]["annotations"][LAST_APPLIED]
    same = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED) == said
    return _Write(ref, desired, patch, repair=applied or same)


def _send(kube: Kube, write: _Write) -> Applied:
    if write.patch is not None:
        kube.patch(write.ref, write.patch)
        return Applied(write.ref, "patched", ",".join(sorted(write.patch)))
    try:
        kube.create(write.desired)
        return Applied(write.ref, "created")
    except KubeError as exc:
        if exc.status != 409:
            raise
    # Someone (a previous run of ours) created it between our read and write.
    live = kube.get(write.ref) or {}
    patch = three_way_patch(last_applied_of(live), write.desired, live)
    if not patch:
        return Applied(write.ref, "unchanged")
    return _send(kube, _Write(write.ref, write.desired, patch))


def apply(kube: Kube, manifest: dict[str, Any]) -> Applied:
    planned = _plan(kube, manifest)
    return planned if isinstance(planned, Applied) else _send(kube, planned)


def apply_all(kube: Kube, manifests: list[dict[str, Any]], optional_kinds: frozenset[str] = frozenset(),
              *, applied: bool = False) -> list[Applied]:
    """Apply in order. An edit is all or nothing as far as the API server can say beforehand:
    every write is first sent as a dry run, so a child it refuses (a value the operator's checks
    let through, an admission policy) raises ChildRefused before any child changes, and an edit
    is never half rolled out (prefill on a new threshold, the gateway on the old). One write is
    not tried dry: a new RoleBinding of a Role new in the same edit, whose dry run the RBAC
    escalation check would refuse for want of the Role.

    A refused repair is not the spec's fault and holds nothing else back: it is reported as
    "refused" and the other writes go on. A repair is a write that puts back what was applied
    before (the child renders as its last-applied record says), or, with `applied` (the spec's
    generation was applied already: a resync, an operator restart or upgrade), any write.
    Kinds in `optional_kinds` (e.g. PodMonitor) may be missing from the cluster: their 404 is
    reported as skipped."""
    results: list[Applied] = []
    writes: list[_Write] = []
    for manifest in manifests:
        planned: _Write | Applied | None = None
        try:
            planned = _plan(kube, manifest, applied)
            if isinstance(planned, _Write) and not _binds_a_new_role(planned, writes):
                _dry_run(kube, planned)
        except KubeError as exc:
            if exc.status == 404 and manifest["kind"] in optional_kinds:
                results.append(Applied(Ref.of(manifest), "skipped", f"{manifest['kind']} API not available"))
                continue
            if not _refuses_the_object(exc):
                raise
            repair = isinstance(planned, _Write) and planned.repair
            refused = ChildRefused(Ref.of(manifest), exc, dry=True, repair=repair)
            if not repair:
                raise refused from exc
            results.append(Applied(refused.ref, "refused", str(refused)))
            continue
        if isinstance(planned, Applied):
            results.append(planned)
        else:
            writes.append(planned)
    for write in writes:
        try:
            results.append(_send(kube, write))
        except KubeError as exc:
            if write.patch is None and exc.status == 404 and write.ref.kind in optional_kinds:
                results.append(Applied(write.ref, "skipped", f"{write.ref.kind} API not available"))
            elif _refuses_the_object(exc) and write.repair:
                results.append(Applied(write.ref, "refused", str(ChildRefused(write.ref, exc, dry=False, repair=True))))
            elif _refuses_the_object(exc):
                raise ChildRefused(write.ref, exc, dry=False) from exc
            else:
                raise
    return results


def _dry_run(kube: Kube, write: _Write) -> None:
    try:
        if write.patch is None:
            kube.create(write.desired, dry_run=True)
        else:
            kube.patch(write.ref, write.patch, dry_run=True)
    except KubeError as exc:
        if write.patch is None and exc.status == 409:
            return   # created meanwhile: the write itself patches it instead
        if exc.status == 400 and "does not support dry run" in exc.message:
            # A webhook with side effects (sideEffects Unknown or Some) refuses every dry run:
            # nothing can be known beforehand, so this child is only tried for real.
            return
        raise


def _binds_a_new_role(write: _Write, earlier: list[_Write]) -> bool:
    if write.patch is not None or write.ref.kind not in ("RoleBinding", "ClusterRoleBinding"):
        return False
    role = write.desired.get("roleRef") or {}
    return any(w.patch is None and w.ref.kind == role.get("kind") and w.ref.name == role.get("name")
               for w in earlier)


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
