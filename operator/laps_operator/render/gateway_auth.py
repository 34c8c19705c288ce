"""The gateway's API keys on Kubernetes: `spec.gateway.apiKeysSecret` mounted read-only and
named by `--api-keys-file`. The kubelet mounts the Secret, so the operator never reads it (no
RBAC on Secrets); a rotated Secret reaches the volume and the gateway re-reads it there."""
from __future__ import annotations

from typing import Any

from laps_operator.spec.cluster import ClusterSpec

API_KEYS_DIR = "/etc/laps/api-keys"
_VOLUME = "api-keys"


def gateway_auth(spec: ClusterSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(volumes, volumeMounts, args) for the gateway's pod; all empty when auth is off."""
    secret = spec.gateway.api_keys_secret
    if secret is None:
        return [], [], []
    # Only the one key is projected, at a fixed file name, readable by its owner and group only
    # (0440): the pod's fsGroup (pod_security.py) is the group the non-root gateway runs as.
    volume = {"name": _VOLUME, "secret": {"secretName": secret.name, "defaultMode": 0o440,
                                          "items": [{"key": secret.key, "path": "keys"}]}}
    mount = {"name": _VOLUME, "mountPath": API_KEYS_DIR, "readOnly": True}
    args = ["--api-keys-file", f"{API_KEYS_DIR}/keys"]
    if spec.gateway.rate_limit_per_key > 0:
        args += ["--rate-limit-per-key", f"{spec.gateway.rate_limit_per_key:g}"]
    return [volume], [mount], args
