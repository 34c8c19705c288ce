"""Why a role is not ready, read from pod and workload status shaped as the API server returns
them (core/v1 PodStatus, apps/v1 DeploymentCondition): what the Ready condition shows."""
from __future__ import annotations

from laps_operator.spec.cluster import parse_spec
from laps_operator.status.conditions import condition, reconciled_status, workload_readiness
from laps_operator.status.pod_problems import DETAIL_CHARS, role_problems

SPEC = parse_spec({"model": {"name": "m", "path": "/m"}, "prefill": {"replicas": 2}})
IMAGE = "ghcr.io/laps-project/laps:0.9.9"   # a tag never pushed
UNSCHEDULABLE = ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
                 "available: 3 No preemption victims found for incoming pod.")


def pod(name: str, *, ready: bool = False, conditions: list | None = None, containers: list | None = None,
        init: list | None = None, phase: str = "Pending", node: str | None = "gpu-node-1", **status) -> dict:
    conds = [{"type": "PodScheduled", "status": "True"}] if node else []
    conds += [{"type": "Ready", "status": "True" if ready else "False"}, *(conditions or [])]
    body = {"metadata": {"name": name, "labels": {"laps.io/role": "prefill"}},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "conditions": conds, **status}}
    if containers is not None:
        body["status"]["containerStatuses"] = containers
    if init is not None:
        body["status"]["initContainerStatuses"] = init
    return body


def engine(state: dict, last: dict | None = None, name: str = "engine") -> dict:
    return {"name": name, "image": IMAGE, "ready": False, "restartCount": 3 if last else 0,
            "state": state, "lastState": {"terminated": last} if last else {}}


def pulling(name: str) -> dict:
    return pod(name, containers=[engine({"waiting": {
        "reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'}})])


def unschedulable(name: str) -> dict:
    return pod(name, node=None, conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                             "message": UNSCHEDULABLE}])


def test_pods_with_the_same_reason_are_counted_together_and_problems_come_before_starting():
    loading = pod("x-prefill-2", containers=[engine({"running": {"startedAt": "2026-01-01T00:00:00Z"}})])
    said = role_problems([loading, pulling("x-prefill-0"), pulling("x-prefill-1"), pod("x-prefill-3", ready=True)])
    assert said == f'2 pods ImagePullBackOff: Back-off pulling image "{IMAGE}"; 1 pod starting'


def test_no_node_with_a_free_gpu_says_what_the_scheduler_said_cut_to_a_bounded_length():
    said = role_problems([unschedulable("x-prefill-0"), unschedulable("x-prefill-1")])
    assert said.startswith("2 pods Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    assert len(said) <= DETAIL_CHARS and said.endswith("...")


def test_a_crash_loop_names_the_last_exit_not_the_pod_specific_back_off_message():
    def crashing(name: str) -> dict:
        return pod(name, containers=[engine(
            {"waiting": {"reason": "CrashLoopBackOff",
                         "message": f"back-off 5m0s restarting failed container=engine pod={name}_default(1234)"}},
            last={"reason": "OOMKilled", "exitCode": 137, "startedAt": "t", "finishedAt": "t"})])
    said = role_problems([crashing("x-decode-6f7-abcde"), crashing("x-decode-6f7-fghij")])
    assert said == "2 pods CrashLoopBackOff: OOMKilled, exit code 137"
    # A laps engine or gateway that cannot start leaves why as its termination message.
    wrong_path = pod("x-prefill-0", containers=[engine(
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=engine"}},
        last={"reason": "Error", "exitCode": 2, "message": "cannot start: /models/m.gguf: no such file or directory"})])
    assert role_problems([wrong_path]) == (
        "1 pod CrashLoopBackOff: Error, exit code 2: cannot start: /models/m.gguf: no such file or directory")


def test_a_missing_secret_key_and_a_stuck_init_container_are_named():
    config = pod("x-gateway-1", containers=[engine({"waiting": {
        "reason": "CreateContainerConfigError", "message": "couldn't find key keys in Secret default/api-keys"}},
        name="gateway")])
    assert role_problems([config]) == (
        "1 pod CreateContainerConfigError: couldn't find key keys in Secret default/api-keys")
    fetching = pod("x-prefill-0", init=[{"name": "fetch-model", "state": {"terminated": {
        "reason": "Error", "exitCode": 1, "message": "403 Forbidden\nfor url"}}}],
        containers=[engine({"waiting": {"reason": "PodInitializing"}})])
    assert role_problems([fetching]) == (
        "1 pod init container fetch-model: Error: exit code 1: 403 Forbidden for url")


def test_a_pod_running_again_after_an_oom_kill_is_starting_and_says_so():
    restarted = pod("x-prefill-0", containers=[engine({"running": {"startedAt": "t"}},
                                                      last={"reason": "OOMKilled", "exitCode": 137})])
    assert role_problems([restarted]) == "1 pod starting: restarted after OOMKilled, exit code 137"
    assert role_problems([pod("x-prefill-1", node=None)]) == "1 pod not scheduled yet"


def test_an_evicted_pod_and_a_deployment_that_cannot_create_pods():
    evicted = pod("x-decode-1", phase="Failed", reason="Evicted",
                  message="The node was low on resource: ephemeral-storage.")
    quota = {"metadata": {"name": "x-decode"}, "status": {"conditions": [
        {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
         "message": 'pods "x-decode-6f7-abcde" is forbidden: exceeded quota: gpus, requested: '
                    "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8"}]}}
    said = role_problems([evicted], quota, "Deployment")
    assert said.startswith('FailedCreate: pods "x-decode-6f7-abcde" is forbidden: exceeded quota: gpus')
    assert said.endswith("; 1 pod Evicted: The node was low on resource: ephemeral-storage.")
    # A StatefulSet says why it made no pods only in its Events: point there.
    sts = {"metadata": {"name": "x-prefill"}, "status": {"replicas": 0}}
    assert role_problems([], sts, "StatefulSet") == "no pods yet (see the events of statefulset/x-prefill)"


def test_many_different_reasons_are_bounded():
    pods = [pod(f"x-prefill-{i}", containers=[engine({"waiting": {"reason": f"Reason{i}", "message": "m"}})])
            for i in range(6)]
    assert role_problems(pods) == "1 pod Reason0: m; 1 pod Reason1: m; 1 pod Reason2: m; 3 more"


def workload(ready: int, want: int, *, replicas: int | None = None, updated: int | None = None) -> dict:
    """A workload's status as its controller writes it."""
    return {"metadata": {"generation": 1, "name": "w"},
            "status": {"observedGeneration": 1, "replicas": want if replicas is None else replicas,
                       "readyReplicas": ready, "updatedReplicas": want if updated is None else updated}}


def test_the_ready_condition_names_each_waiting_roles_reasons_and_drops_them_once_ready():
    pods = {"prefill": [unschedulable("x-prefill-0"), pod("x-prefill-1", ready=True)],
            "decode": [pulling("x-decode-1")], "gateway": [pod("x-gateway-1", ready=True)]}
    waiting = workload_readiness(SPEC, workload(1, 2), workload(0, 1), workload(1, 1), pods)
    status = reconciled_status(None, generation=1, readiness=waiting, now="t")
    ready_condition = condition(status["conditions"], "Ready")
    assert ready_condition["status"] == "False"
    message = ready_condition["message"]
    assert message.startswith("waiting for ready replicas: prefill 1/2 [1 pod Unschedulable: 0/3")
    assert message.endswith(f'], decode 0/1 [1 pod ImagePullBackOff: Back-off pulling image "{IMAGE}"]')
    pods = {"prefill": [pod("x-prefill-0", ready=True), pod("x-prefill-1", ready=True)],
            "decode": [pod("x-decode-1", ready=True)], "gateway": [pod("x-gateway-1", ready=True)]}
    ready = workload_readiness(SPEC, workload(2, 2), workload(1, 1), workload(1, 1), pods)
    assert ready.message == "all prefill, decode and gateway replicas are ready"


def test_a_rollout_stuck_behind_ready_old_pods_says_why_in_progressing():
    """A bad image in an edit: the old gateway pod still serves (Ready), the new one cannot pull."""
    gateway = workload(1, 1, replicas=2, updated=1)   # the surge pod is the updated one
    readiness = workload_readiness(SPEC, workload(2, 2), workload(1, 1), gateway,
                                   {"gateway": [pod("x-gateway-old", ready=True), pulling("x-gateway-new")]})
    assert readiness.ready
    assert readiness.rollout == ('rolling out: gateway 1 old pods still running '
                                 f'[1 pod ImagePullBackOff: Back-off pulling image "{IMAGE}"]')


def test_an_evicted_pod_already_replaced_is_history_not_the_reason():
    """A ReplicaSet leaves an evicted pod in place, replaced, until pod GC: once the role has its
    pods without it, the reason shown is the replacement's, not an eviction from last week."""
    evicted = pod("x-decode-1", phase="Failed", reason="Evicted",
                  message="The node was low on resource: memory.")
    replacement = pulling("x-decode-2")
    assert role_problems([evicted, replacement], None, "Deployment", want=1) == (
        f'1 pod ImagePullBackOff: Back-off pulling image "{IMAGE}"')
    # Not yet replaced: the eviction is why the role is short of a pod.
    assert role_problems([evicted], None, "Deployment", want=1).startswith("1 pod Evicted: The node was low")


def test_a_pod_still_creating_its_containers_is_told_apart_from_one_loading_the_model():
    """A gateway whose apiKeysSecret does not exist sits in ContainerCreating (FailedMount, in
    its events only): "starting" would send the reader to the engine's model loading instead."""
    mounting = pod("x-gateway-1", containers=[engine({"waiting": {"reason": "ContainerCreating"}}, name="gateway")])
    loading = pod("x-gateway-2", phase="Running", containers=[engine({"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                                                                     name="gateway")])
    assert role_problems([mounting, loading]) == (
        "1 pod creating containers (if it stays here, see the pod's events, e.g. FailedMount); 1 pod starting")


def failed_create(pod_name: str, why: str, uid: str, last: str, **extra) -> dict:
    """A FailedCreate Event as the StatefulSet controller records it (core/v1 Event)."""
    return {"metadata": {"name": f"x-prefill.{last}"}, "type": "Warning", "reason": "FailedCreate",
            "involvedObject": {"kind": "StatefulSet", "name": "x-prefill", "uid": uid},
            "message": f"create Pod {pod_name} in StatefulSet x-prefill failed error: {why}", "lastTimestamp": last,
            **extra}


def test_a_statefulset_that_cannot_create_its_pods_says_why_from_its_newest_event():
    psa = 'pods "x-prefill-0" is forbidden: violates PodSecurity "restricted:latest": privileged'
    no_class = 'pods "x-prefill-1" is forbidden: no PriorityClass with name gpu-serving was found'
    sts = {"kind": "StatefulSet", "metadata": {"name": "x-prefill", "uid": "u2"}, "status": {"replicas": 0}}
    events = [failed_create("x-prefill-1", no_class, "u2", "2026-01-01T10:05:00Z"),
              failed_create("x-prefill-0", psa, "u2", "2026-01-01T10:04:59Z"),
              failed_create("x-prefill-0", "quota", "u1", "2026-01-01T10:09:00Z"),   # a deleted namesake's
              {"reason": "SuccessfulCreate", "involvedObject": {"uid": "u2"}, "lastTimestamp": "2026-01-01T11:00:00Z"}]
    said = role_problems([], sts, "StatefulSet", 2, events)
    assert said == f"FailedCreate: {no_class}"
    # With one pod made and the other refused, the refusal comes first.
    said = role_problems([pod("x-prefill-0", ready=True)], sts, "StatefulSet", 2, events)
    assert said == f"FailedCreate: {no_class}"
    # Once every pod exists (the PriorityClass created), the old refusal is history.
    both = [pod("x-prefill-0", ready=True), pod("x-prefill-1", containers=[engine({"running": {}})])]
    assert role_problems(both, sts, "StatefulSet", 2, events) == "1 pod starting"
    # Nothing in the Events (expired, or not readable): the pointer to them stays.
    assert role_problems([], sts, "StatefulSet", 2, []) == "no pods yet (see the events of statefulset/x-prefill)"


def test_a_refusal_of_a_pod_created_since_is_history():
    sts = {"kind": "StatefulSet", "metadata": {"name": "x-prefill", "uid": "u"}, "status": {"replicas": 0}}
    quota, psa = 'pods "x-prefill-1" is forbidden: exceeded quota: gpus', 'pods "x-prefill-0" is forbidden: PodSecurity'
    events = [failed_create("x-prefill-1", quota, "u", "2026-01-01T10:05:00Z"),
              failed_create("x-prefill-0", psa, "u", "2026-01-01T10:01:00Z"),
              {"reason": "SuccessfulCreate", "involvedObject": {"uid": "u"}, "lastTimestamp": "2026-01-01T10:30:00Z",
               "message": "create Pod x-prefill-1 in StatefulSet x-prefill successful"}]
    # x-prefill-1 was made at 10:30 (and deleted since): its quota refusal is over; x-prefill-0's is not.
    assert role_problems([], sts, "StatefulSet", 2, events) == f"FailedCreate: {psa}"
    # x-prefill-0 exists now, its SuccessfulCreate Event expired (they live an hour): history too.
    assert role_problems([pod("x-prefill-0")], sts, "StatefulSet", 2, events[:2]).startswith(f"FailedCreate: {quota};")
    events[1] = {**events[1], "message": events[1]["message"].replace("x-prefill-0", "x-prefill-1")}
    assert role_problems([], sts, "StatefulSet", 2, events) == "no pods yet (see the events of statefulset/x-prefill)"


def test_the_newest_refusal_wins_whichever_event_api_wrote_it():
    sts = {"metadata": {"name": "x-prefill", "uid": "u"}, "status": {"replicas": 0}}
    older = failed_create("x-prefill-0", "old reason", "u", "2026-01-01T10:05:00Z")
    newer = failed_create("x-prefill-0", "new reason", "u", None, eventTime="2026-01-01T10:05:01.123456Z")
    assert role_problems([], sts, "StatefulSet", 1, [newer, older]) == "FailedCreate: new reason"
    assert role_problems([], sts, "StatefulSet", 1, [older, newer]) == "FailedCreate: new reason"
    long = failed_create("x-prefill-0", "x" * 1000, "u", "2026-01-01T10:06:00Z")
    assert len(role_problems([], sts, "StatefulSet", 1, [long])) == DETAIL_CHARS


def test_the_ready_condition_carries_the_statefulsets_refusal():
    quota = 'pods "x-prefill-0" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1'
    sts = {"kind": "StatefulSet", "metadata": {"name": "x-prefill", "uid": "u", "generation": 1},
           "status": {"observedGeneration": 1, "replicas": 0, "readyReplicas": 0}}
    readiness = workload_readiness(SPEC, sts, workload(1, 1), workload(1, 1), {},
                                   {"prefill": [failed_create("x-prefill-0", quota, "u", "2026-01-01T10:00:00Z")]})
    assert readiness.message == f"waiting for ready replicas: prefill 0/2 [FailedCreate: {quota}]"
