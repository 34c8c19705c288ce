"""An edit the API server refuses for one child is applied to none: the operator sends every
patch as a dry run first. Without it, an edit of the length threshold rolled the prefill pods
onto the new threshold and left the gateway on the old one when the gateway's Deployment was
refused (by a validation the operator's own checks missed, or an admission policy). A refusal
is retried each resync: once the policy allows the edit, it lands without another edit.

What the emulator cannot show, and who plays it: it has no admission webhooks; the refusal is
injected (a KMock reaction answering, for dry runs and real writes alike, what a validating
webhook answers: 403 "admission webhook ... denied the request").
"""
from __future__ import annotations

import threading

import kmock

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_operator_e2e import NS, reconciled_without_allocation

DENIED = ('admission webhook "policy.example.com" denied the request: containers must not set '
          '--length-threshold above 256 without approval')


def _threshold(args: list[str]) -> str:
    return args[args.index("--length-threshold") + 1]


def test_an_edit_the_api_server_refuses_for_one_child_changes_no_child_and_says_why(kube_api, start_operator):
    start_operator(LAPS_OPERATOR_RESYNC_SECONDS="1")
    cluster = reconciled_without_allocation(kube_api, "policy")
    before = _threshold(cluster.statefulset().spec.template.spec.containers[0].args)

    refusing = threading.Event()
    refusing.set()
    denial = kmock.Response(status=403, payload={"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                 "code": 403, "reason": "Forbidden", "message": DENIED})
    kube_api.call(lambda: kube_api.emulator["patch", kmock.resource("apps", "v1", "deployments"),
                                                  kmock.namespace(NS), kmock.name("policy-gateway")]
                  << (lambda: denial if refusing.is_set() else NotImplemented))
    cluster.patch_spec({"laps": {"lengthThreshold": 512}})
    invalid = wait_for(lambda: (c := cluster.condition("InvalidSpec")) and c["status"] == "True" and c,
                       "the refusal in the InvalidSpec condition")
    assert invalid["message"].startswith("the API server refuses Deployment/policy-gateway as this spec renders "
                                         "it (no child was changed): admission webhook")
    assert cluster.status()["phase"] == "Invalid" and invalid["reason"] == "ChildRefused"
    # Nothing of the edit reached the prefill pods: engines and gateway still agree.
    assert _threshold(cluster.statefulset().spec.template.spec.containers[0].args) == before

    # The policy lifted (the edit approved): the resync tries the refused edit again, and all of it lands.
    refusing.clear()
    wait_for(lambda: cluster.status().get("phase") != "Invalid"
             and (cluster.condition("InvalidSpec") or {}).get("status") == "False", "the spec valid again")
    assert _threshold(cluster.statefulset().spec.template.spec.containers[0].args) == "512"
    gateway = cluster.apps.read_namespaced_deployment("policy-gateway", NS)
    assert _threshold(gateway.spec.template.spec.containers[0].args) == "512"
