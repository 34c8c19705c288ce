"""Security contexts of the pods the operator builds: the restricted Pod Security Standard
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), so a cluster can live in
a namespace labelled `pod-security.kubernetes.io/enforce: restricted`.

GPU engines need no exception in the common setup: the NVIDIA device plugin and container toolkit
hand the container its /dev/nvidia* nodes readable and writable by any user, and CUDA needs no
capability. Where a node's driver setup restricts those nodes to a group (e.g. `video`), the
exception is a supplementalGroups entry, which the restricted profile allows; an image that must
run as root (UID 0) cannot meet the profile and needs a namespace at `baseline`. Neither is
made the default here (docs/kubernetes.md, "Pod security").
"""
from __future__ import annotations

from typing import Any

# The Dockerfile's `USER 65532:65532` for every laps image (operator, gateway, engine); set
# here too, so an image without a USER (SGLang's runs as root by default) does not make the
# kubelet refuse the pod for runAsNonRoot.
RUN_AS_ID = 65532
SCRATCH_DIR = "/tmp"
_SCRATCH_VOLUME = "tmp"


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_ID,
        "runAsGroup": RUN_AS_ID,
        # Writable volumes (emptyDirs, a model PVC the engine reads) owned by the pods' group.
        "fsGroup": RUN_AS_ID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(read_only_root: bool) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},  # every port is above 1024: not even NET_BIND_SERVICE
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted(pod_spec: dict[str, Any], *, read_only_root: bool = True) -> dict[str, Any]:
    """`pod_spec` with the restricted profile's contexts on the pod and every container, and an
    emptyDir as the writable /tmp (and $HOME: the UID has no home directory, and Python, torch,
    Triton and Hugging Face put their caches under it). `read_only_root`: False for images whose
    writes we cannot enumerate (SGLang's JIT kernels); the profile does not require it."""
    volumes = [*pod_spec.get("volumes", []), {"name": _SCRATCH_VOLUME, "emptyDir": {}}]
    containers = []
    for container in pod_spec["containers"]:
        env = list(container.get("env", []))
        if not any(e.get("name") == "HOME" for e in env):  # the user's own HOME wins
            # First, so that the user's entries may refer to $(HOME).
            env.insert(0, {"name": "HOME", "value": SCRATCH_DIR})
        mounts = [*container.get("volumeMounts", []), {"name": _SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}]
        containers.append({**container, "env": env, "volumeMounts": mounts,
                           "securityContext": container_security_context(read_only_root)})
    return {**pod_spec, "securityContext": pod_security_context(), "containers": containers,
            "volumes": volumes}
