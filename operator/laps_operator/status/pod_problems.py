"""Why a role's replicas are not ready (pure), from its pods' status and its workload's.

The Ready condition carries this so that `kubectl describe lapscluster` names the usual day-1
failures of GPU serving: no node with a free GPU (Unschedulable), a wrong image or pull secret
(ImagePullBackOff), an engine that crashes (CrashLoopBackOff, with its last exit: OOMKilled...),
a missing Secret or ConfigMap key (CreateContainerConfigError), and pods the workload cannot
create at all (quota, Pod Security, a missing PriorityClass: a Deployment's ReplicaFailure, a
StatefulSet's FailedCreate Event). The shapes read are the API's (core/v1 PodStatus and Event,
apps/v1 DeploymentCondition).
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

# A condition message is read by people: each fact is cut to this many characters (an image
# pull error or a scheduler message can run to a kilobyte) and a role names at most this many.
DETAIL_CHARS = 160
MAX_FACTS = 3
# What every pod goes through on its way to ready: said last, after any real problem.
STARTING, TERMINATING, UNSCHEDULED = "starting", "terminating", "not scheduled yet"
# Pulling the image (many GB for an engine) or mounting volumes; a pod stuck here is most often a volume that cannot
# mount (a missing Secret: spec.gateway.apiKeysSecret), which only the pod's events say.
CREATING = "creating containers (if it stays here, see the pod's events, e.g. FailedMount)"
ROUTINE = frozenset({STARTING, TERMINATING, UNSCHEDULED, CREATING})
# Waiting reasons of a container that is on its way up, not stuck.
ON_ITS_WAY = frozenset({"ContainerCreating", "PodInitializing"})


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True: the EndpointSlice controller lists it as ready, so
    Services (and the gateways' discovery) route to it."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _short(text: str) -> str:
    text = " ".join(str(text).split())   # termination messages (log tails) span lines
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 3].rstrip() + "..."


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or () if c.get("type") == type_), None)


def _last_exit(container: Mapping[str, Any]) -> str:
    """"OOMKilled, exit code 137" from a container's previous run; "" when it has none."""
    last = (container.get("lastState") or {}).get("terminated") or {}
    return f"{last.get('reason') or 'terminated'}, {_exit_code(last)}" if last else ""


def _exit_code(terminated: Mapping[str, Any]) -> str:
    said = f"exit code {terminated.get('exitCode', '?')}"
    return f"{said}: {terminated['message']}" if terminated.get("message") else said


def _container_problem(container: Mapping[str, Any], who: str, init: bool) -> tuple[str, str] | None:
    state = container.get("state") or {}
    waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
    reason = waiting.get("reason")
    if reason and reason not in ON_ITS_WAY:
        # CrashLoopBackOff's own message names the pod ("back-off 5m0s restarting failed
        # container=engine pod=x-prefill-0_ns(uid)"): the last exit says why, and groups.
        detail = _last_exit(container) if reason == "CrashLoopBackOff" else waiting.get("message") or ""
        return f"{who}{reason}", detail
    if terminated and (not init or terminated.get("exitCode") != 0):
        return f"{who}{terminated.get('reason') or 'Terminated'}", _exit_code(terminated)
    return None


def pod_problem(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, detail) of one pod that is not ready; None when it is."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return TERMINATING, ""
    if status.get("phase") == "Failed":   # evicted, or the node rejected it
        return status.get("reason") or "Failed", status.get("message") or ""
    if pod_ready(pod):
        return None
    scheduled = _condition(status, "PodScheduled") or {}
    if scheduled.get("status") == "False":   # "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        return scheduled.get("reason") or "Unschedulable", scheduled.get("message") or ""
    inits, apps = status.get("initContainerStatuses") or (), status.get("containerStatuses") or ()
    # Init containers run first: a stuck one is why the others wait. A container is named only
    # where the pod has several (a sidecar an admission webhook injected, say).
    for group, init in ((inits, True), (apps, False)):
        for container in group:
            who = f"init container {container.get('name')}: " if init else (
                f"container {container.get('name')}: " if len(apps) > 1 else "")
            found = _container_problem(container, who, init)
            if found:
                return found
    if not (pod.get("spec") or {}).get("nodeName") and not scheduled:
        return UNSCHEDULED, ""
    if any(((c.get("state") or {}).get("waiting") or {}).get("reason") in ON_ITS_WAY for c in (*inits, *apps)):
        return CREATING, ""
    # Running but not ready: its readiness probe has not passed (the model is loading). A
    # previous run that ended (OOMKilled while loading) is worth saying.
    restarted = next((_last_exit(c) for c in apps if _last_exit(c)), "")
    return STARTING, f"restarted after {restarted}" if restarted else ""


def _replica_failure(workload: Mapping[str, Any] | None) -> str:
    """A Deployment's ReplicaFailure: its pods cannot be created (quota, Pod Security, ...)."""
    failure = _condition((workload or {}).get("status") or {}, "ReplicaFailure") or {}
    if failure.get("status") != "True":
        return ""
    return _short(f"{failure.get('reason') or 'ReplicaFailure'}: {failure.get('message') or ''}")


def _event_time(event: Mapping[str, Any]) -> str:
    # core/v1 Events carry lastTimestamp; those written through events.k8s.io carry eventTime
    # and series. Seconds only: "…05.123456Z" and "…05Z" must compare by time, not by text.
    said = ((event.get("series") or {}).get("lastObservedTime") or event.get("lastTimestamp")
            or event.get("eventTime") or event.get("firstTimestamp")
            or (event.get("metadata") or {}).get("creationTimestamp") or "")
    return str(said)[:19]


def creation_failure(events: Iterable[Mapping[str, Any]], uid: str | None, existing: Iterable[str] = ()) -> str:
    """Why a StatefulSet cannot create its pods (a ResourceQuota, Pod Security admission, a
    PriorityClass that does not exist): its controller says so only in a FailedCreate Event,
    where a Deployment has ReplicaFailure. The newest such Event of the workload with this `uid`
    (a deleted namesake's Events outlive it by an hour), in the API server's words; "" if none."""
    events = [e for e in events if not uid or (e.get("involvedObject") or {}).get("uid") == uid]
    # A pod that exists (`existing`), or was created after its refusal (the quota raised, then
    # the pod deleted again), makes that refusal history; the controller refreshes the Event of
    # one that still fails.
    existing = set(existing)
    created: dict[str, str] = {}
    failures: list[tuple[str, Mapping[str, Any]]] = []
    for event in events:
        pod = _created_pod(event)
        if event.get("reason") == "SuccessfulCreate" and pod:
            created[pod] = max(created.get(pod, ""), _event_time(event))
        elif event.get("reason") == "FailedCreate" and pod not in existing:
            failures.append((pod, event))
    failed = [e for pod, e in failures if pod not in created or _event_time(e) > created[pod]]
    if not failed:
        return ""
    message = str(max(failed, key=_event_time).get("message") or "")
    # "create Pod x-prefill-0 in StatefulSet x-prefill failed error: pods "x-prefill-0" is
    # forbidden: exceeded quota: ...": the refusal is what is worth the condition's room.
    return _short(f"FailedCreate: {message.split(' failed error: ', 1)[-1]}")


def _created_pod(event: Mapping[str, Any]) -> str:
    # The StatefulSet controller's words: "create Pod x-prefill-1 in StatefulSet x-prefill ...".
    found = re.match(r"create Pod (\S+) in ", str(event.get("message") or ""))
    return found.group(1) if found else ""


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


def role_problems(pods: Iterable[Mapping[str, Any]], workload: Mapping[str, Any] | None = None,
                  kind: str = "", want: int | None = None, events: Iterable[Mapping[str, Any]] = ()) -> str:
    """Why a role's pods are not ready, in a few words: pods with the same reason and detail
    counted together ("2 pods ImagePullBackOff: ..."), problems before routine start-up, at
    most MAX_FACTS facts. "" when there is nothing to say. `kind`: the workload's kind; `want`:
    its replicas; `events`: the workload's Events (read for a StatefulSet short of pods)."""
    pods = list(pods)
    live = sum(not _finished(pod) for pod in pods)
    failure = _replica_failure(workload)
    if not failure and want is not None and live < want:
        # Only while pods are missing: once they all exist (the quota raised), an old refusal
        # is history. The prefill StatefulSet creates its pods in parallel, so a missing one is
        # one it could not create, or one it is creating right now.
        failure = creation_failure(events, ((workload or {}).get("metadata") or {}).get("uid"),
                                   {(p.get("metadata") or {}).get("name") for p in pods if not _finished(p)})
    facts = [failure] if failure else []
    if want is not None and live >= want:
        # A ReplicaSet never deletes a pod that ended (evicted, its node shut down): it lingers,
        # replaced, until pod GC. Once its replacements are all there it is history, not why.
        pods = [pod for pod in pods if not _finished(pod)]
    counts = Counter(found for pod in pods if (found := pod_problem(pod)) is not None)
    order = sorted(counts.items(), key=lambda item: (item[0][0] in ROUTINE, -item[1], item[0]))
    for (reason, detail), n in order:
        said = f"{n} pod{'s' if n > 1 else ''} {reason}"
        facts.append(_short(f"{said}: {detail}") if detail else said)
    if not pods and not facts and workload is not None and not (workload.get("status") or {}).get("replicas"):
        # A Deployment reports pods it cannot create in ReplicaFailure (above); a StatefulSet
        # only in its Events. (One that counts pods the list missed has nothing to explain.)
        name = (workload.get("metadata") or {}).get("name")
        facts.append(f"no pods yet (see the events of statefulset/{name})" if kind == "StatefulSet" else "no pods yet")
    if len(facts) > MAX_FACTS:
        facts = [*facts[:MAX_FACTS], f"{len(facts) - MAX_FACTS} more"]
    return "; ".join(facts)
