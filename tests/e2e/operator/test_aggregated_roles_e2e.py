"""Namespace users and LAPSClusters: `helm install` of the chart, then users of the rights the
chart aggregates into Kubernetes' built-in `view` and `edit`/`admin` roles read and manage
LAPSClusters in their namespace, against the emulated API server enforcing RBAC
(tests/support/kube_emulator_rbac.py).

What the emulator cannot show: it runs no ClusterRole aggregation controller and has no
built-in `view`/`edit`/`admin` roles. On a real cluster that controller copies the rules of every
ClusterRole labelled `rbac.authorization.k8s.io/aggregate-to-<role>: "true"` into `<role>`, so a
RoleBinding to `edit` carries them. Here the test does the one step the controller would make
possible: it finds the chart's ClusterRoles by those labels and binds them directly, each in one
namespace, to a ServiceAccount standing for the user."""
from __future__ import annotations

from contextlib import ExitStack

import kubernetes
import pytest
import yaml

from tests.e2e.operator.conftest import REPO
from tests.e2e.operator.least_privilege import CHART, GROUP, PLURAL, RELEASE, RELEASE_NS, VERSION

NS, OTHER_NS = "default", "team-b"
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def _install_chart(kube_api) -> None:
    import helm_python

    helm = helm_python.Config(kubeconfig_path=str(kube_api.kubeconfig), storage_driver="memory",
                              namespace=RELEASE_NS)
    try:
        helm.install(str(CHART), RELEASE, {}, namespace=RELEASE_NS, create_namespace=True)
    finally:
        helm.close()


def _user_bound_to(kube_api, builtin: str, clients: ExitStack) -> kubernetes.client.CustomObjectsApi:
    """A ServiceAccount in NS bound there to the chart's ClusterRole(s) aggregated into
    `builtin`, as a user bound to `builtin` in NS; its client (closed with `clients`)."""
    admin = kube_api.api_client()
    rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
    roles = rbac.list_cluster_role(label_selector=f"{AGGREGATE}{builtin}=true").items
    assert roles, f"no ClusterRole aggregates into {builtin}"
    user = f"user-{builtin}"
    kubernetes.client.CoreV1Api(admin).create_namespaced_service_account(NS, {"metadata": {"name": user}})
    for role in roles:
        rbac.create_namespaced_role_binding(NS, {
            "metadata": {"name": f"{user}-{role.metadata.name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role.metadata.name},
            "subjects": [{"kind": "ServiceAccount", "name": user, "namespace": NS}]})
    client = kubernetes.config.new_client_from_config(config_file=str(kube_api.kubeconfig_for(NS, user)))
    clients.callback(client.close)
    return kubernetes.client.CustomObjectsApi(client)


def _refused(call) -> None:
    with pytest.raises(kubernetes.client.ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body


def test_users_of_the_built_in_roles_get_and_apply_lapsclusters_in_their_namespace(kube_api):
    with ExitStack() as clients:
        _install_chart(kube_api)
        users = [_user_bound_to(kube_api, role, clients) for role in ("view", "edit", "admin")]
        kube_api.require_credentials()
        _story(*users)


def _story(viewer, editor, admin_user) -> None:
    example = yaml.safe_load((REPO / "examples" / "lapscluster.yaml").read_text())
    name = example["metadata"]["name"]
    merge = "application/merge-patch+json"

    # `kubectl apply -f` (client-side): a read, then create; applied again: a read, then patch.
    _refused(lambda: viewer.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, example))
    editor.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, example)
    editor.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, {"spec": {"prefill": {"replicas": 2}}},
                                          _content_type=merge)
    # `kubectl get laps` / `kubectl describe laps NAME`, for every one of the three.
    for user in (viewer, editor, admin_user):
        listed = user.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
        assert [(c["metadata"]["name"], c["spec"]["prefill"]["replicas"]) for c in listed] == [(name, 2)]
        assert user.get_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, name)["metadata"]["name"] == name
    _refused(lambda: viewer.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, {"spec": {}},
                                                           _content_type=merge))
    _refused(lambda: viewer.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name))
    # Status is the operator's: no user role writes it.
    for user in (editor, admin_user):
        _refused(lambda u=user: u.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, name, {"status": {"phase": "Ready"}}, _content_type=merge))
    # Bound in one namespace, the rights stay there.
    _refused(lambda: editor.list_namespaced_custom_object(GROUP, VERSION, OTHER_NS, PLURAL))
    _refused(lambda: editor.create_namespaced_custom_object(GROUP, VERSION, OTHER_NS, PLURAL, example))
    admin_user.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    assert viewer.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"] == []
