"""RBAC for the Kubernetes API emulator, written from the documented behaviour of kube-apiserver
(https://kubernetes.io/docs/reference/access-authn-authz/rbac/ and .../authorization/):

* request attributes: the verb from the HTTP method (GET one object: get, a collection: list,
  `?watch=true`: watch; POST create, PUT update, PATCH patch (server-side apply too), DELETE one
  object: delete, a collection: deletecollection), API group, resource, subresource,
  namespace, name; for the `namespaces` resource the namespace is the object's own name;
  anything that is not a resource URL is a non-resource request (its path, verb from method).
* a rule allows a resource request when its apiGroups, resources, verbs and resourceNames all
  match: "*" matches anything, `pods/log` names a subresource, `*/scale` that subresource of
  every resource (and `pods/*` nothing special); resourceNames never match a request without a
  name (create, list, watch, deletecollection). A non-resource rule matches an exact path or a
  prefix ending in `*`, and only counts in a ClusterRole bound by a ClusterRoleBinding.
* a ClusterRoleBinding grants its ClusterRole's rules everywhere (cluster-scoped resources and
  every namespace); a RoleBinding grants its Role's (or a ClusterRole's) rules in its own
  namespace only. Subjects: User, Group, ServiceAccount (user
  `system:serviceaccount:<ns>:<name>`, groups `system:serviceaccounts` and
  `system:serviceaccounts:<ns>`). Permissions only add up: nothing denies.
* escalation prevention of the RBAC API: creating or updating a Role/ClusterRole needs every
  permission it grants (at the role's scope) or the `escalate` verb on it; creating or updating
  a binding needs every permission of the role it references, or `bind` on that role.

Pure: the objects come from a `lookup` function (resource plural, namespace) -> stored dicts.
Aggregated ClusterRoles are not emulated (a ClusterRole's own rules are its rules).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

RBAC_GROUP = "rbac.authorization.k8s.io"
MASTERS = "system:masters"
Lookup = Callable[[str, "str | None"], list[dict]]   # (plural, namespace) -> objects


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...]

    @classmethod
    def service_account(cls, namespace: str, name: str) -> Identity:
        return cls(f"system:serviceaccount:{namespace}:{name}",
                   ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))

    def describe(self) -> str:
        return f'User "{self.user}"'


ANONYMOUS = Identity("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True)
class Attributes:
    """What the authoriser decides on: one (verb, group, resource, ...) or one (verb, path)."""
    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""                   # set for non-resource requests only

    @property
    def is_resource(self) -> bool:
        return not self.path

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def describe(self) -> str:
        if not self.is_resource:
            return f'cannot {self.verb} path "{self.path}"'
        where = f' in the namespace "{self.namespace}"' if self.namespace else " at the cluster scope"
        return (f'cannot {self.verb} resource "{self.full_resource}" in API group "{self.group}"'
                + where)


def verb_of(method: str, *, named: bool, watch: bool) -> str:
    if method in ("GET", "HEAD"):
        return "watch" if watch else ("get" if named else "list")
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def resource_attributes(method: str, params: dict, *, group: str, plural: str, namespace: str | None,
                        name: str | None, subresource: str | None) -> Attributes:
    watch = str(params.get("watch", "")).lower() in ("true", "1")
    ns = name if plural == "namespaces" and group == "" and name else (namespace or "")
    return Attributes(verb_of(method, named=bool(name), watch=watch), group, plural, subresource or "",
                      ns, name or "")


def non_resource_attributes(method: str, path: str) -> Attributes:
    return Attributes(verb_of(method, named=True, watch=False), path=path)


# --- rule matching ---------------------------------------------------------------------------

def _has(values: Iterable[str] | None, wanted: str) -> bool:
    values = list(values or ())
    return "*" in values or wanted in values


def _resource_matches(rule_resources: Iterable[str] | None, attrs: Attributes) -> bool:
    for entry in rule_resources or ():
        if entry == "*" or entry == attrs.full_resource:
            return True
        if attrs.subresource and entry == f"*/{attrs.subresource}":
            return True
    return False


def _path_matches(patterns: Iterable[str] | None, path: str) -> bool:
    for pattern in patterns or ():
        if pattern == "*" or pattern == path or (pattern.endswith("*") and path.startswith(pattern[:-1])):
            return True
    return False


def rule_allows(rule: dict, attrs: Attributes) -> bool:
    if not _has(rule.get("verbs"), attrs.verb):
        return False
    if not attrs.is_resource:
        return _path_matches(rule.get("nonResourceURLs"), attrs.path)
    names = rule.get("resourceNames") or []
    return (_has(rule.get("apiGroups"), attrs.group) and _resource_matches(rule.get("resources"), attrs)
            and (not names or attrs.name in names))


# --- the authoriser --------------------------------------------------------------------------

def _subject_matches(subject: dict, identity: Identity, binding_namespace: str | None) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return identity.user == f"system:serviceaccount:{namespace}:{name}"
    if kind == "User":
        return identity.user == name
    if kind == "Group":
        return name in identity.groups
    return False


class Authorizer:
    def __init__(self, lookup: Lookup) -> None:
        self._lookup = lookup

    def _role(self, plural: str, namespace: str | None, name: str) -> dict | None:
        return next((r for r in self._lookup(plural, namespace) if r["metadata"]["name"] == name), None)

    def _granted_rules(self, identity: Identity, namespace: str) -> Iterable[tuple[str, dict]]:
        """(where, rule) for every rule bound to `identity` that applies in `namespace` ("" for
        cluster scope); ClusterRoleBindings first, as the real authoriser visits them."""
        for binding in self._lookup("clusterrolebindings", None):
            if any(_subject_matches(s, identity, None) for s in binding.get("subjects") or ()):
                role = self._role("clusterroles", None, binding["roleRef"]["name"])
                for rule in (role or {}).get("rules") or ():
                    yield f'ClusterRoleBinding "{binding["metadata"]["name"]}"', rule
        if not namespace:
            return
        for binding in self._lookup("rolebindings", namespace):
            if not any(_subject_matches(s, identity, namespace) for s in binding.get("subjects") or ()):
                continue
            ref = binding["roleRef"]
            role = (self._role("roles", namespace, ref["name"]) if ref.get("kind") == "Role"
                    else self._role("clusterroles", None, ref["name"]))
            for rule in (role or {}).get("rules") or ():
                if not rule.get("nonResourceURLs"):
                    yield f'RoleBinding "{namespace}/{binding["metadata"]["name"]}"', rule

    def authorize(self, identity: Identity, attrs: Attributes) -> tuple[bool, str]:
        """(allowed, why): the binding that allowed it, or the API server's forbidden text."""
        if MASTERS in identity.groups:
            return True, f"group {MASTERS}"
        for where, rule in self._granted_rules(identity, attrs.namespace if attrs.is_resource else ""):
            if rule_allows(rule, attrs):
                return True, where
        return False, f"{identity.describe()} {attrs.describe()}"

    # --- escalation prevention -----------------------------------------------------------------

    def missing_for_rules(self, identity: Identity, rules: Iterable[dict], namespace: str,
                          check: Callable[[Identity, Attributes], bool] | None = None) -> list[Attributes]:
        """The permissions among `rules` that `identity` does not hold in `namespace`. A wildcard
        in a granted rule is held only through the same wildcard ("*" is asked for literally)."""
        check = check or (lambda who, attrs: self.authorize(who, attrs)[0])
        missing = []
        for attrs in expand_rules(rules, namespace):
            if not check(identity, attrs):
                missing.append(attrs)
        return missing

    def rules_of_role_ref(self, ref: dict, namespace: str | None) -> list[dict] | None:
        plural = "roles" if ref.get("kind") == "Role" else "clusterroles"
        role = self._role(plural, namespace if plural == "roles" else None, ref.get("name", ""))
        return None if role is None else list(role.get("rules") or ())


def expand_rules(rules: Iterable[dict], namespace: str) -> list[Attributes]:
    """Every (verb, group, resource[/sub], name) a list of rules grants, one Attributes each."""
    out: list[Attributes] = []
    for rule in rules:
        verbs = rule.get("verbs") or []
        if rule.get("nonResourceURLs"):
            out += [Attributes(v, path=p) for v in verbs for p in rule["nonResourceURLs"]]
            continue
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                plural, _, sub = resource.partition("/")
                for verb in verbs:
                    for name in (rule.get("resourceNames") or [""]):
                        out.append(Attributes(verb, group, plural, sub, namespace, name))
    return out


def bootstrap_policy() -> list[tuple[str, dict]]:
    """(plural, object) of the default roles every cluster has that matter here: discovery and
    public info for every authenticated user (system:discovery, system:public-info-viewer) and
    cluster-admin for system:masters."""
    def cluster_role(name: str, rules: list[dict]) -> tuple[str, dict]:
        return "clusterroles", {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRole",
                                "metadata": {"name": name}, "rules": rules}

    def binding(name: str, groups: list[str]) -> tuple[str, dict]:
        return "clusterrolebindings", {
            "apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups]}

    public = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
    discovery = ["/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", *public]
    return [
        cluster_role("system:discovery", [{"nonResourceURLs": discovery, "verbs": ["get"]}]),
        binding("system:discovery", ["system:authenticated"]),
        cluster_role("system:public-info-viewer", [{"nonResourceURLs": public, "verbs": ["get"]}]),
        binding("system:public-info-viewer", ["system:authenticated", "system:unauthenticated"]),
        cluster_role("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                                       {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        binding("cluster-admin", [MASTERS]),
    ]
