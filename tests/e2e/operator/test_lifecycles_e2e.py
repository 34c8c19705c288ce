"""Unusual but realistic LAPSCluster lifecycles, against the real operator: neighbours in one
namespace and namesakes in two, a cluster deleted and created again while its pods live on,
allocation turned off and on, and a Prometheus URL that a template rendered with an empty value.

What the emulator cannot show, and who plays it: no StatefulSet controller, so the test creates
and deletes the prefill pods a StatefulSet would (`pods_of`); its garbage collector works at
once, so pods that outlive their cluster are made with `kubectl delete --cascade=orphan` (in a
real cluster a plain deletion also leaves them running through their grace period, where the
StatefulSet controller waits for them before it makes new ones); CEL rules are not evaluated
(the specs here pass them); no Prometheus runs, so with allocation on the pressure is unknown.
"""
from __future__ import annotations

from tests.e2e.operator.conftest import wait_for
from tests.e2e.operator.test_day2_e2e import running
from tests.e2e.operator.test_operator_e2e import GROUP, GROUP_LABEL, NS, PLURAL, VERSION, Cluster, example

OTHER_NS = "team-b"


def pods_of(core, namespace: str, cluster: str) -> dict[str, dict]:
    """The cluster's prefill pods: name -> (labels, resourceVersion)."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"laps.io/cluster={cluster},laps.io/role=prefill")
    return {p.metadata.name: (p.metadata.labels, p.metadata.resource_version) for p in pods.items}


def make_prefill_pods(apps, core, namespace: str, cluster: str) -> None:
    """As the StatefulSet controller would, in any namespace (Cluster's helper works in NS)."""
    sts = apps.read_namespaced_stateful_set(f"{cluster}-prefill", namespace)
    for i in range(sts.spec.replicas):
        core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{sts.metadata.name}-{i}", "labels": dict(sts.spec.template.metadata.labels),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts.metadata.name,
                                              "uid": sts.metadata.uid, "controller": True}]},
            "spec": {"containers": [{"name": "engine", "image": "engine"}]}})


def test_neighbours_and_namesakes_keep_to_their_own_pods(kube_api, start_operator):
    operator = start_operator(scope=("--namespace", NS, "--namespace", OTHER_NS))
    a, _ = running(kube_api, example("a"))
    b, _ = running(kube_api, example("b", prefill={"replicas": 2}))
    custom, core, apps = a.custom, a.core, a.apps
    custom.create_namespaced_custom_object(GROUP, VERSION, OTHER_NS, PLURAL, example("a", prefill={"replicas": 2}))
    wait_for(lambda: apps.read_namespaced_stateful_set("a-prefill", OTHER_NS), "the namesake's StatefulSet")
    make_prefill_pods(apps, core, OTHER_NS, "a")

    def namesake_status() -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, OTHER_NS, PLURAL, "a").get("status") or {}

    wait_for(lambda: namesake_status().get("groups") == {"short": ["a-prefill-0"], "long": ["a-prefill-1"]},
             "the namesake's own groups")
    assert a.status()["groups"] == {"short": ["a-prefill-0", "a-prefill-1"], "long": ["a-prefill-2", "a-prefill-3"]}
    assert b.status()["groups"] == {"short": ["b-prefill-0"], "long": ["b-prefill-1"]}
    wait_for(lambda: {pod: labels[GROUP_LABEL] for pod, (labels, _) in pods_of(core, OTHER_NS, "a").items()}
             == {"a-prefill-0": "short", "a-prefill-1": "long"}, "the namesake's pods labelled")
    # Every Service (the gateway's included) selects its own cluster's pods only.
    for cluster in (a, b):
        for service in cluster.services().values():
            assert service.spec.selector["laps.io/cluster"] == cluster.name, service.metadata.name
    wait_for(lambda: operator.metric("laps_operator_group_size", cluster=f"{OTHER_NS}/a", group="short") == 1
             and operator.metric("laps_operator_group_size", cluster=f"{NS}/a", group="short") == 2,
             "group sizes per namespace/name")

    # Deleting one leaves its neighbour and its namesake exactly as they were.
    b_pods, namesake_pods = pods_of(core, NS, "b"), pods_of(core, OTHER_NS, "a")
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "a")
    wait_for(lambda: not pods_of(core, NS, "a"), "a's pods collected")
    # The namesake's loops still run: a spec edit there still reaches its children.
    custom.patch_namespaced_custom_object(GROUP, VERSION, OTHER_NS, PLURAL, "a", {"spec": {"prefill": {"replicas": 3}}},
                                          _content_type="application/merge-patch+json")
    wait_for(lambda: apps.read_namespaced_stateful_set("a-prefill", OTHER_NS).spec.replicas == 3, "namesake scaled")
    assert pods_of(core, NS, "b") == b_pods and pods_of(core, OTHER_NS, "a") == namesake_pods
    assert b.statefulset().spec.replicas == 2 and b.status()["groupSizes"] == {"short": 1, "long": 1}


def test_a_cluster_created_again_over_its_orphaned_pods_adopts_them_and_their_groups(kube_api, start_operator):
    start_operator()
    cluster, _ = running(kube_api, example("again"))
    # As after allocation moves: pod 1 went long, so the groups are no longer the first half.
    cluster.custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, "again", {"status": {
        "groups": {"short": ["again-prefill-0"], "long": ["again-prefill-1", "again-prefill-2", "again-prefill-3"]}}},
        _content_type="application/merge-patch+json")
    cluster.core.patch_namespaced_pod("again-prefill-1", NS, {"metadata": {"labels": {GROUP_LABEL: "long"}}})
    sts_uid = cluster.statefulset().metadata.uid

    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "again", propagation_policy="Orphan")
    assert not cluster.statefulset().metadata.owner_references   # orphaned, still there
    created = cluster.create(example("again", prefill={"replicas": 3}))

    # The new cluster adopts the StatefulSet in place (no second one, no recreated pods) ...
    wait_for(lambda: [o.uid for o in cluster.statefulset().metadata.owner_references or []]
             == [created["metadata"]["uid"]], "the StatefulSet adopted")
    assert cluster.statefulset().metadata.uid == sts_uid and cluster.statefulset().spec.replicas == 3
    cluster.act_as_statefulset_controller()   # removes pod 3
    # ... and keeps the groups the pods carry (its status started empty): the gateway's routing
    # does not change under the users' feet.
    wait_for(lambda: cluster.status().get("groups") == {"short": ["again-prefill-0"],
                                                        "long": ["again-prefill-1", "again-prefill-2"]},
             "the groups the pods carry")
    assert cluster.pod_groups() == {"again-prefill-0": "short", "again-prefill-1": "long", "again-prefill-2": "long"}


def test_allocation_turned_off_says_so_and_back_on_resumes(kube_api, start_operator):
    start_operator()
    body = example("toggle")
    body["spec"]["laps"]["allocation"]["intervalSeconds"] = 1
    cluster, groups = running(kube_api, body)
    wait_for(lambda: (cluster.condition("PressureUnavailable") or {}).get("status") == "True",
             "pressure unknown (no Prometheus)")
    assert cluster.status()["allocation"]["lastDecision"].startswith("pressure unknown")
    generations = {name: cluster.apps.read_namespaced_deployment(name, NS).metadata.generation
                   for name in ("toggle-decode", "toggle-gateway")} | {"toggle-prefill": cluster.statefulset().metadata.generation}

    cluster.patch_spec({"laps": {"allocation": {"enabled": False}}})
    off = wait_for(lambda: (s := cluster.status()).get("allocation", {}).get("lastDecision") == "allocation is off"
                   and s, "the loop says it is off")
    assert "pressure" not in off   # `kubectl get laps -o wide` shows no pressure it no longer reads
    unavailable = cluster.condition("PressureUnavailable")
    assert (unavailable["status"], unavailable["reason"]) == ("False", "AllocationOff")

    cluster.patch_spec({"laps": {"allocation": {"enabled": True}}})
    wait_for(lambda: cluster.status().get("allocation", {}).get("lastDecision", "").startswith("pressure unknown")
             and cluster.condition("PressureUnavailable")["status"] == "True", "the loop back on")
    assert cluster.pod_groups() == groups
    # An operator-only knob: no workload changed, so no pod rolled.
    assert generations == {name: cluster.apps.read_namespaced_deployment(name, NS).metadata.generation
                           for name in ("toggle-decode", "toggle-gateway")} | {
                               "toggle-prefill": cluster.statefulset().metadata.generation}


def test_a_prometheus_url_with_an_empty_host_part_is_invalid_spec_not_a_traceback_loop(kube_api, start_operator):
    operator = start_operator()
    body = example("tpl", monitoring={"prometheusURL": "http://prometheus..svc:9090"})  # {{ .ns }} was empty
    body["spec"]["laps"]["allocation"]["intervalSeconds"] = 1
    cluster = Cluster(kube_api, "tpl")
    cluster.create(body)   # the CRD's pattern lets it through
    invalid = wait_for(lambda: (c := cluster.condition("InvalidSpec")) and c["status"] == "True" and c,
                       "the InvalidSpec condition")
    assert invalid["message"].startswith("spec.monitoring.prometheusURL: 'http://prometheus..svc:9090' is not a URL")
    assert not cluster.apps.list_namespaced_stateful_set(NS).items

    # Fixed, the cluster runs and its loop reports the (unreachable) Prometheus as a condition.
    cluster.patch_spec({"monitoring": {"prometheusURL": "http://prometheus.svc:9090"}})
    wait_for(lambda: (cluster.condition("PressureUnavailable") or {}).get("reason") == "PrometheusUnreachable",
             "PressureUnavailable")
    assert "Traceback" not in operator.log()

