"""The resync changes nothing that is already right: quantities the API server stored in their
canonical form (`cpu: 1000m` reads back as "1") are equal to what the spec asks for. The API
emulator canonicalises pod-template quantities as kube-apiserver does (kube_emulator_quantities).
And writes that keep failing say so in a condition. The emulator has no RBAC or admission: the
refusals are injected (KMock reactions answering 403 in the server's place)."""
from __future__ import annotations

import kmock

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_operator_e2e import Cluster, example, reconciled_without_allocation

RESOURCES = {"requests": {"cpu": "1000m", "memory": "2048Mi"}, "limits": {"memory": "4096Mi", "cpu": "1.5"}}


def test_resync_leaves_canonicalised_quantities_alone(kube_api, start_operator):
    operator = start_operator(LAPS_OPERATOR_RESYNC_SECONDS="0.5")
    cluster = Cluster(kube_api, "quant")
    body = example("quant")
    body["spec"]["laps"]["allocation"]["enabled"] = False
    body["spec"]["prefill"]["resources"] = RESOURCES
    cluster.create(body)
    sts = wait_for(cluster.statefulset, "the prefill StatefulSet")
    stored = sts.spec.template.spec.containers[0].resources
    assert (stored.requests, stored.limits) == ({"cpu": "1", "memory": "2Gi"}, {"memory": "4Gi", "cpu": "1500m"})
    wait_for(lambda: cluster.status().get("observedGeneration") == cluster.get()["metadata"]["generation"],
             "the spec reconciled")
    version = sts.metadata.resource_version

    ok = operator.metric("laps_operator_reconciles_total", result="ok")
    wait_for(lambda: operator.metric("laps_operator_reconciles_total", result="ok") >= ok + 4, "four resyncs")
    assert cluster.statefulset().metadata.resource_version == version   # not written once
    assert "Repaired" not in {reason for reason, _ in cluster.events()}


def test_writes_that_keep_failing_show_in_a_condition_until_they_succeed(kube_api, start_operator):
    start_operator(LAPS_OPERATOR_RESYNC_SECONDS="0.5")
    cluster = reconciled_without_allocation(kube_api, "denied")
    # The API server refuses the next 6 StatefulSet writes (RBAC taken away, an admission
    # webhook saying no...), then accepts them again.
    kube_api.call(lambda: kube_api.emulator["patch", kmock.resource("apps", "v1", "statefulsets")][:6]
                  << {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403, "reason": "Forbidden",
                      "message": 'statefulsets.apps "denied-prefill" is forbidden'} << 403)
    cluster.patch_spec({"laps": {"lengthThreshold": 512}})
    failing = wait_for(lambda: (c := cluster.condition("WritesFailing")) and c["status"] == "True" and c,
                       "the WritesFailing condition")
    assert failing["reason"] == "WriteFailures" and "forbidden" in failing["message"]
    wait_for(lambda: any(r == "WritesFailing" for r, _ in cluster.events()), "a WritesFailing event")
    cleared = wait_for(lambda: (c := cluster.condition("WritesFailing")) and c["status"] == "False" and c,
                       "the condition to clear")
    assert cleared["reason"] == "Recovered"
    args = cluster.statefulset().spec.template.spec.containers[0].args
    assert args[args.index("--length-threshold") + 1] == "512"
