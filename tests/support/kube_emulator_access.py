"""Access control of the Kubernetes API emulator: who is calling (bearer tokens), may they
(RBAC, kube_emulator_rbac.py), and the checks a write meets after authorisation: RBAC's
escalation prevention and the OwnerReferencesPermissionEnforcement admission plugin.

* Authentication: the admin kubeconfig's token is a member of `system:masters` (what kind or
  kubeadm hand out); a ServiceAccount token comes from the TokenRequest API
  (`POST .../serviceaccounts/<name>/token`, as the kubelet gets one for a pod) and stops working
  when that ServiceAccount is deleted (tokens are bound to its uid); any other token is 401
  Unauthorized. A request with no credentials is `system:anonymous` once a test calls
  `require_credentials()`; until then it stands for the admin, because Helm's Go client (seen
  here) sends no bearer token to a plain-HTTP server, and the emulator serves plain HTTP.
* OwnerReferencesPermissionEnforcement (on here, as on OpenShift and clusters that enable it):
  setting or changing `metadata.ownerReferences` needs `delete` on the object; setting
  `blockOwnerDeletion: true` on a reference needs `update` on the owner's `finalizers`
  subresource. Both are 403 with the plugin's own wording.
* Every decision is kept in `audit` (who, what, allowed, why it was asked): what a test reads to
  learn which permissions a program really used.
"""
from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.kube_emulator_rbac import ANONYMOUS, MASTERS, RBAC_GROUP, Attributes, Authorizer, Identity, Lookup

ADMIN_TOKEN = "emulator-token"   # the token in the fixture's admin kubeconfig
ADMIN = Identity("kubernetes-admin", (MASTERS, "system:authenticated"))
_ROLES = {"roles", "clusterroles"}
# Asking whether the writer of a role or binding may skip the escalation check (verb `escalate`
# or `bind`): a "no" here refuses nothing, the permissions are then checked one by one.
SHORTCUT = "escalate-or-bind"
_BINDINGS = {"rolebindings": "roles", "clusterrolebindings": "clusterroles"}


@dataclass(frozen=True)
class AuditEntry:
    request_id: int
    user: str
    attrs: Attributes
    allowed: bool
    purpose: str          # "request" | "escalation" | SHORTCUT | "owner-references"


class Forbidden(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


@dataclass
class AccessControl:
    lookup: Lookup                                          # (plural, namespace) -> objects
    find: Callable[[str, str, str, str | None], dict | None]   # (group, plural, ns, name)
    plural_of_kind: Callable[[str, str], str | None]        # (apiVersion, kind) -> plural
    audit: list[AuditEntry] = field(default_factory=list)
    _tokens: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    anonymous: Identity = ADMIN

    def __post_init__(self) -> None:
        self.authorizer = Authorizer(self.lookup)

    # --- authentication ------------------------------------------------------------------------

    def require_credentials(self) -> None:
        """From now on a request without a token is system:anonymous, as on a real server."""
        self.anonymous = ANONYMOUS

    def issue_token(self, namespace: str, name: str, uid: str) -> str:
        token = secrets.token_urlsafe(24)
        self._tokens[token] = (namespace, name, uid)
        return token

    def authenticate(self, authorization: str | None) -> Identity:
        if not authorization:
            return self.anonymous
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token == ADMIN_TOKEN:
            return ADMIN
        if scheme.lower() == "bearer" and token in self._tokens:
            namespace, name, uid = self._tokens[token]
            account = self.find("", "serviceaccounts", namespace, name)
            if account is not None and account["metadata"].get("uid") == uid:
                return Identity.service_account(namespace, name)
        raise Forbidden(401, "Unauthorized", "Unauthorized")

    # --- authorisation -------------------------------------------------------------------------

    def allowed(self, request_id: int, identity: Identity, attrs: Attributes, purpose: str) -> tuple[bool, str]:
        allowed, why = self.authorizer.authorize(identity, attrs)
        self.audit.append(AuditEntry(request_id, identity.user, attrs, allowed, purpose))
        return allowed, why

    def authorize_request(self, request_id: int, identity: Identity, attrs: Attributes) -> None:
        allowed, why = self.allowed(request_id, identity, attrs, "request")
        if not allowed:
            raise Forbidden(403, "Forbidden", f"{_what(attrs)} is forbidden: {why}")

    # --- checks on writes ----------------------------------------------------------------------

    @staticmethod
    def checks_writes_of(identity: Identity) -> bool:
        """Escalation and owner-reference checks skip system:masters, as the authoriser does."""
        return MASTERS not in identity.groups

    def admit_write(self, request_id: int, identity: Identity, attrs: Attributes,
                    old: dict | None, new: dict | None) -> None:
        """Escalation prevention (RBAC objects) and owner-reference admission for one write of
        `old` into `new` (old None: a create); raises Forbidden."""
        if new is None or attrs.subresource or not self.checks_writes_of(identity):
            return
        if attrs.group == RBAC_GROUP and attrs.resource in _ROLES:
            self._no_escalation(request_id, identity, attrs, new.get("rules") or [], "escalate")
        elif attrs.group == RBAC_GROUP and attrs.resource in _BINDINGS:
            self._may_bind(request_id, identity, attrs, new.get("roleRef") or {})
        self._owner_references(request_id, identity, attrs, old, new)

    def _holds(self, request_id: int, identity: Identity, attrs: Attributes, purpose: str) -> bool:
        return self.allowed(request_id, identity, attrs, purpose)[0]

    def _no_escalation(self, request_id: int, identity: Identity, attrs: Attributes,
                       rules: list[dict], shortcut_verb: str) -> None:
        shortcut = Attributes(shortcut_verb, attrs.group, attrs.resource, "", attrs.namespace, attrs.name)
        if shortcut_verb == "escalate" and self._holds(request_id, identity, shortcut, SHORTCUT):
            return
        missing = self.authorizer.missing_for_rules(
            identity, rules, attrs.namespace,
            check=lambda who, wanted: self._holds(request_id, who, wanted, "escalation"))
        if missing:
            listed = "; ".join(f"{{{m.group or 'core'} {m.full_resource} {m.verb}}}" for m in missing)
            raise Forbidden(403, "Forbidden", f'{_what(attrs)} is forbidden: {identity.describe()} '
                                              f"is attempting to grant RBAC permissions not currently held: {listed}")

    def _may_bind(self, request_id: int, identity: Identity, attrs: Attributes, ref: dict) -> None:
        role_plural = "roles" if ref.get("kind") == "Role" else "clusterroles"
        bind = Attributes("bind", RBAC_GROUP, role_plural, "", attrs.namespace if role_plural == "roles" else "",
                          ref.get("name", ""))
        if self._holds(request_id, identity, bind, SHORTCUT):
            return
        rules = self.authorizer.rules_of_role_ref(ref, attrs.namespace or None)
        if rules is None:
            raise Forbidden(403, "Forbidden", f'{_what(attrs)} is forbidden: {ref.get("kind")} '
                                              f'"{ref.get("name")}" not found and {identity.describe()} may not bind it')
        self._no_escalation(request_id, identity, attrs, rules, "bind")

    def _owner_references(self, request_id: int, identity: Identity, attrs: Attributes,
                          old: dict | None, new: dict) -> None:
        before = ((old or {}).get("metadata") or {}).get("ownerReferences") or []
        after = (new.get("metadata") or {}).get("ownerReferences") or []
        if before == after:
            return
        delete = Attributes("delete", attrs.group, attrs.resource, "", attrs.namespace,
                            attrs.name or (new.get("metadata") or {}).get("name", ""))
        if not self._holds(request_id, identity, delete, "owner-references"):
            raise Forbidden(403, "Forbidden", f"{_what(attrs)} is forbidden: cannot set an ownerRef on a "
                                              f"resource you can't delete: {identity.describe()} {delete.describe()}")
        already = {r.get("uid") for r in before if r.get("blockOwnerDeletion")}
        for ref in after:
            if not ref.get("blockOwnerDeletion") or ref.get("uid") in already:
                continue
            api_version = ref.get("apiVersion", "")
            group = api_version.rpartition("/")[0] if "/" in api_version else ""
            plural = self.plural_of_kind(api_version, ref.get("kind", ""))
            finalizers = Attributes("update", group, plural or "", "finalizers", attrs.namespace, ref.get("name", ""))
            if plural is None or not self._holds(request_id, identity, finalizers, "owner-references"):
                raise Forbidden(403, "Forbidden", f"{_what(attrs)} is forbidden: cannot set blockOwnerDeletion "
                                                  "if an ownerReference refers to a resource you can't set "
                                                  f"finalizers on: {identity.describe()} {finalizers.describe()}")


def _what(attrs: Attributes) -> str:
    """How the API server names the object in a 403: `statefulsets.apps "x"`, `pods`."""
    if not attrs.is_resource:
        return "path " + repr(attrs.path)
    resource = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    return f'{resource} "{attrs.name}"' if attrs.name else resource
