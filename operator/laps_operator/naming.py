"""Names and labels of everything the operator creates (docs/contracts.md, "Objects, labels and annotations")."""
from __future__ import annotations

import re
from dataclasses import dataclass

# The custom resource's API: group, version, kind and plural (the CRD, kopf's handlers, owner references).
GROUP = "laps.io"
VERSION = "v1alpha1"
KIND = "LAPSCluster"
PLURAL = "lapsclusters"
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"

MANAGER = "laps-operator"
# The operator's own label and annotation keys (these labels, apply.LAST_APPLIED, kopf's state on
# the LAPSCluster): a CR's podLabels, podAnnotations and serviceAnnotations may not use it.
OPERATOR_KEY_PREFIX = "laps.io/"
CLUSTER_LABEL = "laps.io/cluster"
ROLE_LABEL = "laps.io/role"
GROUP_LABEL = "laps.io/prefill-group"   # its values: laps_agent.policy.classes.CLASSES

ENGINE_PORT = 30000
BOOTSTRAP_PORT = 8998
# What the gateway container listens on, whatever spec.gateway.port (the Service's port) says:
# unprivileged, since the pods run as non-root without NET_BIND_SERVICE (pod_security.py).
GATEWAY_PORT = 8000
HTTP_PORT_NAME = "http"   # every pod's HTTP container port: Services, probes, monitors, the gateway policy name it
OPERATOR_METRICS_PORT = 8080
OPERATOR_LIVENESS_PORT = 8081
LABELS_FILE = "/etc/podinfo/labels"
# The operator's own pods, as the chart labels them (charts/laps/templates/_helpers.tpl,
# laps.selectorLabels without the release name, which the operator does not know).
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "laps", "app.kubernetes.io/component": "operator"}

# A cluster's name prefixes every child's name, so it must fit the strictest of them. Services
# (`<name>-gateway`, `<name>-prefill-short`, ...) are DNS-1035 labels: lowercase letters, digits
# and '-', starting with a letter, at most 63 characters. The longest bound is the prefill
# StatefulSet's: its pods carry the label controller-revision-hash=`<statefulset>-<hash>` (a hash
# of up to 10 characters; label values have at most 63), so `<name>-prefill` may have at most 52
# characters. The CRD's schema states the same rule (metadata.name); this repeats it for servers
# that did not validate the object.
MAX_CLUSTER_NAME = 63 - len("-0123456789") - len("-prefill")
CLUSTER_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def cluster_name_problem(name: str) -> str | None:
    """Why `name` cannot name a LAPSCluster's children, or None when it can."""
    if len(name) > MAX_CLUSTER_NAME:
        return (f"metadata.name: {len(name)} characters, at most {MAX_CLUSTER_NAME}: it prefixes the "
                f"children's names (the prefill StatefulSet `{name[:8]}...-prefill` gives its pods a "
                "label `<statefulset>-<hash>` of at most 63 characters)")
    if not re.match(CLUSTER_NAME_PATTERN, name):
        return ("metadata.name: must consist of lowercase letters, digits and '-', start with a letter "
                f"and end with a letter or digit ({name!r}): it prefixes the names of Services, "
                "which are DNS-1035 labels")
    return None


@dataclass(frozen=True)
class ClusterRef:
    """The LAPSCluster that owns the children: enough for names and owner references."""

    name: str
    namespace: str
    uid: str

    @property
    def prefill(self) -> str:
        return f"{self.name}-prefill"

    def prefill_group_service(self, group: str) -> str:
        return f"{self.name}-prefill-{group}"

    @property
    def decode(self) -> str:
        return f"{self.name}-decode"

    @property
    def gateway(self) -> str:
        return f"{self.name}-gateway"

    def network_policy(self, role: str) -> str:
        return f"{self.name}-{role}"

    @property
    def config(self) -> str:
        return f"{self.name}-config"

    def owner_reference(self) -> dict:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def cluster_labels(cluster: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "laps",
        "app.kubernetes.io/instance": cluster,
        "app.kubernetes.io/managed-by": MANAGER,
        CLUSTER_LABEL: cluster,
    }


def component_labels(cluster: str, component: str) -> dict[str, str]:
    """Labels of an object of one component; workloads' components double as their role."""
    labels = {**cluster_labels(cluster), "app.kubernetes.io/component": component}
    if component in ("prefill", "decode", "gateway"):
        labels[ROLE_LABEL] = component
    return labels


def object_meta(cluster: ClusterRef, name: str, component: str) -> dict:
    """metadata of a child: its labels and the owner reference the garbage collector follows."""
    return {
        "name": name,
        "namespace": cluster.namespace,
        "labels": component_labels(cluster.name, component),
        "ownerReferences": [cluster.owner_reference()],
    }


def role_selector(cluster: str, role: str) -> dict[str, str]:
    """The smallest selector of a role's pods: StatefulSet/Deployment selectors are immutable,
    so they hold only labels that never change."""
    return {CLUSTER_LABEL: cluster, ROLE_LABEL: role}

