"""RBAC in the API emulator, one documented kube-apiserver behaviour per test
(https://kubernetes.io/docs/reference/access-authn-authz/rbac/), through the official client
authenticated with ServiceAccount tokens from the TokenRequest API."""
from __future__ import annotations

import json

import kubernetes
import pytest
from kubernetes.client import ApiException

RBAC = "rbac.authorization.k8s.io"


class Setup:
    """The admin's side: accounts, roles and bindings, written through the API."""

    def __init__(self, kube_api):
        self.kube_api = kube_api
        kube_api.require_credentials()

    def post(self, path: str, body: dict) -> dict:
        response = self.kube_api.http.post(path, json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def account(self, namespace: str, name: str):
        self.post(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
        return client_for(self.kube_api, namespace, name)

    def role(self, namespace: str | None, name: str, rules: list[dict]) -> None:
        where = f"/namespaces/{namespace}/roles" if namespace else "/clusterroles"
        self.post(f"/apis/{RBAC}/v1{where}", {"metadata": {"name": name}, "rules": rules})

    def bind(self, namespace: str | None, name: str, role_kind: str, role: str, subjects: list[dict]) -> None:
        where = f"/namespaces/{namespace}/rolebindings" if namespace else "/clusterrolebindings"
        self.post(f"/apis/{RBAC}/v1{where}", {"metadata": {"name": name}, "subjects": subjects,
                                              "roleRef": {"apiGroup": RBAC, "kind": role_kind, "name": role}})

    def grant(self, namespace: str, account: str, rules: list[dict], name: str = "r") -> None:
        self.role(namespace, name, rules)
        self.bind(namespace, name, "Role", name, [sa(namespace, account)])

    def config_map(self, namespace: str, name: str) -> None:
        self.post(f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": name}})


def sa(namespace: str, name: str) -> dict:
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


def client_for(kube_api, namespace: str, name: str) -> kubernetes.client.CoreV1Api:
    api = kubernetes.config.new_client_from_config(config_file=str(kube_api.kubeconfig_for(namespace, name)))
    kube_api._clients.append(api)
    return kubernetes.client.CoreV1Api(api)


def status(call) -> int:
    try:
        call()
    except ApiException as exc:
        return exc.status
    return 200


@pytest.fixture
def admin(kube_api) -> Setup:
    return Setup(kube_api)


def test_without_a_binding_everything_is_forbidden_with_the_api_servers_message(admin):
    core = admin.account("team", "bot")
    with pytest.raises(ApiException) as denied:
        core.list_namespaced_config_map("team")
    assert denied.value.status == 403
    body = json.loads(denied.value.body)
    assert body["reason"] == "Forbidden"
    assert body["message"] == ('configmaps is forbidden: User "system:serviceaccount:team:bot" cannot list '
                               'resource "configmaps" in API group "" in the namespace "team"')


def test_discovery_is_open_to_every_authenticated_user_and_not_to_anonymous(admin, kube_api):
    core = admin.account("team", "bot")
    assert core.get_api_resources().group_version == "v1"       # /api/v1 via system:discovery
    anonymous = kube_api.http.get("/api/v1", headers={"Authorization": ""})
    assert anonymous.status_code == 403 and "system:anonymous" in anonymous.json()["message"]


def test_a_wrong_token_and_the_token_of_a_deleted_account_are_401(admin, kube_api):
    core = admin.account("team", "bot")
    admin.grant("team", "bot", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}])
    assert status(lambda: core.list_namespaced_config_map("team")) == 200
    wrong = kube_api.http.get("/api/v1/namespaces/team/configmaps", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    kube_api.http.delete("/api/v1/namespaces/team/serviceaccounts/bot").raise_for_status()
    assert status(lambda: core.list_namespaced_config_map("team")) == 401
    assert kube_api.http.post("/api/v1/namespaces/team/serviceaccounts/ghost/token", json={}).status_code == 404


def test_verbs_follow_the_http_method_get_list_and_watch_are_distinct(admin):
    core = admin.account("team", "bot")
    admin.config_map("team", "a")
    admin.grant("team", "bot", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}])
    assert status(lambda: core.read_namespaced_config_map("a", "team")) == 200
    assert status(lambda: core.list_namespaced_config_map("team")) == 403
    assert status(lambda: core.list_namespaced_config_map("team", watch=True, timeout_seconds=1,
                                                          _preload_content=False)) == 403
    assert status(lambda: core.delete_namespaced_config_map("a", "team")) == 403
    assert status(lambda: core.delete_collection_namespaced_config_map("team")) == 403


def test_resource_names_limit_named_requests_and_never_match_create_or_list(admin):
    core = admin.account("team", "bot")
    admin.config_map("team", "a")
    admin.config_map("team", "b")
    admin.grant("team", "bot", [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a"],
                                 "verbs": ["get", "list", "create"]}])
    assert status(lambda: core.read_namespaced_config_map("a", "team")) == 200
    assert status(lambda: core.read_namespaced_config_map("b", "team")) == 403
    assert status(lambda: core.list_namespaced_config_map("team")) == 403
    assert status(lambda: core.create_namespaced_config_map("team", {"metadata": {"name": "a2"}})) == 403


def test_a_subresource_needs_its_own_rule_and_star_slash_names_it_for_all(admin):
    core = admin.account("team", "bot")
    admin.post("/api/v1/namespaces/team/pods", {"metadata": {"name": "p"},
                                                "spec": {"containers": [{"name": "c", "image": "x"}]}})
    admin.grant("team", "bot", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}])
    patch = {"status": {"phase": "Running"}}
    assert status(lambda: core.patch_namespaced_pod("p", "team", {"metadata": {"labels": {"a": "b"}}})) == 200
    assert status(lambda: core.patch_namespaced_pod_status("p", "team", patch)) == 403
    admin.grant("team", "bot", [{"apiGroups": [""], "resources": ["*/status"], "verbs": ["patch"]}], name="s")
    assert status(lambda: core.patch_namespaced_pod_status("p", "team", patch)) == 200


def test_api_groups_must_match_and_star_matches_every_group(admin, kube_api):
    core = admin.account("team", "bot")
    apps = kubernetes.client.AppsV1Api(core.api_client)
    admin.grant("team", "bot", [{"apiGroups": ["apps"], "resources": ["configmaps", "deployments"],
                                 "verbs": ["list"]}])
    assert status(lambda: apps.list_namespaced_deployment("team")) == 200
    assert status(lambda: core.list_namespaced_config_map("team")) == 403   # configmaps are core
    admin.grant("team", "bot", [{"apiGroups": ["*"], "resources": ["configmaps"], "verbs": ["list"]}], name="any")
    assert status(lambda: core.list_namespaced_config_map("team")) == 200


def test_a_role_binding_grants_only_in_its_namespace_and_never_cluster_wide(admin):
    core = admin.account("team", "bot")
    admin.role(None, "reader", [{"apiGroups": [""], "resources": ["configmaps", "namespaces"], "verbs": ["list"]}])
    admin.bind("team", "reader", "ClusterRole", "reader", [sa("team", "bot")])   # a ClusterRole, namespaced use
    assert status(lambda: core.list_namespaced_config_map("team")) == 200
    assert status(lambda: core.list_namespaced_config_map("other")) == 403
    assert status(lambda: core.list_config_map_for_all_namespaces()) == 403
    assert status(lambda: core.list_namespace()) == 403                  # cluster-scoped


def test_a_cluster_role_binding_grants_every_namespace_and_cluster_scoped_resources(admin):
    core = admin.account("team", "bot")
    admin.role(None, "reader", [{"apiGroups": [""], "resources": ["configmaps", "namespaces"], "verbs": ["list"]}])
    admin.bind(None, "reader", "ClusterRole", "reader", [sa("team", "bot")])
    assert status(lambda: core.list_namespaced_config_map("other")) == 200
    assert status(lambda: core.list_config_map_for_all_namespaces()) == 200
    assert status(lambda: core.list_namespace()) == 200


def test_subjects_match_by_account_namespace_by_group_and_by_user(admin):
    bot = admin.account("team", "bot")
    twin = admin.account("elsewhere", "bot")                            # same name, other namespace
    rule = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]
    admin.grant("team", "bot", rule)
    assert status(lambda: bot.list_namespaced_config_map("team")) == 200
    assert status(lambda: twin.list_namespaced_config_map("team")) == 403
    admin.bind("team", "all-accounts-of-elsewhere", "Role", "r",
               [{"kind": "Group", "name": "system:serviceaccounts:elsewhere", "apiGroup": RBAC}])
    assert status(lambda: twin.list_namespaced_config_map("team")) == 200
    other = admin.account("team", "other")
    admin.bind("team", "by-user", "Role", "r",
               [{"kind": "User", "name": "system:serviceaccount:team:other", "apiGroup": RBAC}])
    assert status(lambda: other.list_namespaced_config_map("team")) == 200


def test_granting_a_permission_one_does_not_hold_is_escalation_and_forbidden(admin):
    core = admin.account("team", "bot")
    rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
    admin.grant("team", "bot", [{"apiGroups": [RBAC], "resources": ["roles", "rolebindings"], "verbs": ["create"]},
                                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}])
    held = {"metadata": {"name": "held"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}
    more = {"metadata": {"name": "more"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]}]}
    assert status(lambda: rbac.create_namespaced_role("team", held)) == 200
    with pytest.raises(ApiException) as denied:
        rbac.create_namespaced_role("team", more)
    assert denied.value.status == 403 and "not currently held" in json.loads(denied.value.body)["message"]
    # Binding a role is escalation-checked the same way, unless `bind` is granted on it.
    admin.role("team", "big", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])
    binding = {"metadata": {"name": "b"}, "subjects": [sa("team", "bot")],
               "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "big"}}
    assert status(lambda: rbac.create_namespaced_role_binding("team", binding)) == 403
    admin.grant("team", "bot", [{"apiGroups": [RBAC], "resources": ["roles"], "resourceNames": ["big"],
                                 "verbs": ["bind"]}], name="may-bind")
    assert status(lambda: rbac.create_namespaced_role_binding("team", binding)) == 200
    # ... and a role with `escalate` may grant anything.
    admin.grant("team", "bot", [{"apiGroups": [RBAC], "resources": ["roles"], "verbs": ["escalate"]}], name="esc")
    assert status(lambda: rbac.create_namespaced_role("team", more)) == 200


def test_owner_references_need_delete_on_the_object_and_finalizers_on_a_blocking_owner(admin, kube_api):
    core = admin.account("team", "bot")
    admin.config_map("team", "owner")
    uid = kube_api.find("v1/configmaps", "team", "owner")["metadata"]["uid"]

    def child(name: str, block: bool) -> dict:
        return {"metadata": {"name": name, "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "blockOwnerDeletion": block}]}}

    admin.grant("team", "bot", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}])
    with pytest.raises(ApiException) as denied:
        core.create_namespaced_config_map("team", child("a", block=False))
    assert denied.value.status == 403 and "can't delete" in json.loads(denied.value.body)["message"]
    admin.grant("team", "bot", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["delete"]}], name="del")
    assert status(lambda: core.create_namespaced_config_map("team", child("a", block=False))) == 200
    with pytest.raises(ApiException) as denied:
        core.create_namespaced_config_map("team", child("b", block=True))
    assert "blockOwnerDeletion" in json.loads(denied.value.body)["message"]
    admin.grant("team", "bot", [{"apiGroups": [""], "resources": ["configmaps/finalizers"], "resourceNames": ["owner"],
                                 "verbs": ["update"]}], name="fin")
    assert status(lambda: core.create_namespaced_config_map("team", child("b", block=True))) == 200


def test_the_audit_records_who_asked_for_what_and_why(admin, kube_api):
    core = admin.account("team", "bot")
    admin.grant("team", "bot", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}])
    core.list_namespaced_config_map("team")
    status(lambda: core.read_namespaced_config_map("x", "team"))
    mine = [(e.attrs.verb, e.attrs.resource, e.allowed) for e in kube_api.audit
            if e.user == "system:serviceaccount:team:bot" and e.attrs.is_resource]
    assert mine == [("list", "configmaps", True), ("get", "configmaps", False)]
