"""The sections of a LAPSCluster's spec that say what its pods run and where: the model, the
engine (image, backend), each pool's size and resources, and the placement (nodeSelector,
tolerations, affinity, priority, topology spread: their parts in placement.py) and pod
labels and annotations that the pools and the gateway share. cluster.py assembles them with the
LAPS knobs into ClusterSpec; the same camelCase aliases and strictness apply, and the same
generation of the CRD from them (crd.py).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from laps_operator.spec.formats import (
    DNS_SUBDOMAIN_PATTERN,
    QUANTITY_PATTERN,
    env_name_problem,
    requests_over_limits,
    resource_problem,
)
from laps_operator.spec.placement import (
    Affinity,
    AnnotationMap,
    LabelMap,
    PodLabelMap,
    SpecModel,
    Toleration,
    TopologySpreadConstraint,
)

# x-kubernetes-int-or-string in the CRD, with the pattern of the API server's serialized form
# (resource_problem checks it, saying which value is wrong).
Quantity = Annotated[int | str, Field(json_schema_extra={"pattern": QUANTITY_PATTERN})]
# The image of `laps engine` and `laps gateway`: both defaults (docs/kubernetes.md, "Images").
DEFAULT_IMAGE = "ghcr.io/laps-project/laps:0.1.0"


# Kubernetes' VolumeSource fields (core/v1 Volume but `name`), as of 1.37, each with the fields
# its schema requires (a PVC without claimName is refused on every write of the workload).
VOLUME_SOURCES: dict[str, tuple[str, ...]] = {
    "awsElasticBlockStore": ("volumeID",), "azureDisk": ("diskName", "diskURI"),
    "azureFile": ("secretName", "shareName"), "cephfs": ("monitors",), "cinder": ("volumeID",),
    "configMap": (), "csi": ("driver",), "downwardAPI": (), "emptyDir": (), "ephemeral": (), "fc": (),
    "flexVolume": ("driver",), "flocker": (), "gcePersistentDisk": ("pdName",), "gitRepo": ("repository",),
    "glusterfs": ("endpoints", "path"), "hostPath": ("path",), "image": (), "iscsi": ("targetPortal", "iqn", "lun"),
    "nfs": ("server", "path"), "persistentVolumeClaim": ("claimName",), "photonPersistentDisk": ("pdID",),
    "portworxVolume": ("volumeID",), "projected": (), "quobyte": ("registry", "volume"), "rbd": ("monitors", "image"),
    "scaleIO": ("gateway", "system", "secretRef"), "secret": (), "storageos": (), "vsphereVolume": ("volumePath",),
}


class ModelSpec(SpecModel):
    name: str = Field(min_length=1, description="model name (informational; also the served name unless "
                                                "servedName is set)")
    path: str = Field(min_length=1, description="local path (GGUF file or HF directory) or URI, as seen inside "
                                                "the engine container")
    served_name: str | None = Field(default=None,
                                    description="model name clients send in requests; defaults to model.name")
    # In the CRD {} is refused as well: the API server would make it an emptyDir.
    volume: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"minProperties": 1},
        description="optional Kubernetes volume with exactly one source (e.g. persistentVolumeClaim) mounted at "
                    "mountPath (a `name` in it is replaced by the operator's)")
    mount_path: str = Field(default="/models", description="where model.volume is mounted in the engine "
                                                          "containers (and the gateway's), an absolute path")

    @field_validator("volume")
    @classmethod
    def _one_source(cls, volume: dict[str, Any] | None) -> dict[str, Any] | None:
        # The API server turns a volume without a known source ({} or a misspelt key) into an
        # emptyDir: engines that start on an empty /models and crash-loop on "model not found".
        if volume is None:
            return None
        sources = [key for key in volume if key != "name"]
        if unknown := sorted(set(sources) - set(VOLUME_SOURCES)):
            raise ValueError(f"{', '.join(unknown)}: not a Kubernetes volume source "
                             "(persistentVolumeClaim, nfs, csi, hostPath, ...)")
        if len(sources) != 1:
            raise ValueError("needs exactly one volume source, e.g. persistentVolumeClaim: {claimName: models}")
        if not isinstance(volume[sources[0]], dict):
            raise ValueError(f"{sources[0]} must be an object")
        if missing := [f for f in VOLUME_SOURCES[sources[0]] if volume[sources[0]].get(f) in (None, "", [])]:
            raise ValueError(f"{sources[0]} needs {', '.join(missing)}")
        return volume

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"{path!r}: must be an absolute path, such as /models")
        return path

    @property
    def served(self) -> str:
        return self.served_name or self.name


# SGLang 0.5.23's --disaggregation-transfer-backend choices that move real KV (`fake` moves none).
TransferBackend = Literal["mooncake", "mooncake_tcp", "nixl", "ascend", "mori"]


class SGLangSpec(SpecModel):
    # How a SGLang prefill pod hands its KV to decode (backend sglang only).
    transfer_backend: TransferBackend = Field(
        default="mooncake",
        description="SGLang's --disaggregation-transfer-backend (how prefill hands KV to decode)")


# An engine.env entry: Kubernetes' EnvVar, kept as written (_env_has_names checks it).
EnvVar = Annotated[dict[str, Any], Field(json_schema_extra={
    "required": ["name"],
    "properties": {"name": {"type": "string", "minLength": 1}, "value": {"type": "string"}}})]


class EngineSpec(SpecModel):
    backend: Literal["builtin", "sglang"] = Field(
        default="builtin", description="builtin: `laps engine`; sglang: stock SGLang with the LAPS plugin")
    sglang: SGLangSpec = Field(default=SGLangSpec(), description="settings of the sglang backend (stock SGLang "
                                                                 "with the LAPS plugin)")
    image: str = Field(default=DEFAULT_IMAGE, min_length=1, description="the engines' image")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="the imagePullPolicy of the engine and gateway pods")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="the engines' --device (auto: the "
                                                                               "engine picks)")
    max_queued_requests: int | None = Field(
        default=None, ge=0,
        description="Builtin engines only (refused with backend sglang): requests an engine holds waiting before "
                    "it answers new ones 503 queue_full (the gateway retries them on another pod); 0 means no "
                    "bound. Unset: the engine's default, 4x max running requests and at least 256.")
    extra_args: tuple[str, ...] = Field(
        default=(), description="more engine flags, after the operator's, on both pools; none of the flags the "
                                "operator sets")
    env: tuple[EnvVar, ...] = Field(
        default=(), description="more environment variables of the engine containers (Kubernetes' EnvVar); none "
                                "of those the operator sets")

    @field_validator("image")
    @classmethod
    def _no_spaces(cls, image: str) -> str:
        # The API server refuses whitespace at the ends (a template's slip), the runtime inside.
        if len(image.split()) != 1 or image.strip() != image:
            raise ValueError(f"{image!r}: an image reference has no spaces")
        return image

    @field_validator("env")
    @classmethod
    def _env_has_names(cls, env: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        for item in env:
            if not isinstance(item.get("name"), str) or not item["name"]:
                raise ValueError("every env entry needs a non-empty 'name'")
            if problem := env_name_problem(item["name"]):
                raise ValueError(problem)
            if item.get("value") not in (None, "") and item.get("valueFrom") is not None:
                raise ValueError(f"{item['name']}: takes 'value' or 'valueFrom', not both")
        return env


class ResourcesSpec(SpecModel):
    limits: dict[str, Quantity] = Field(default_factory=dict)
    requests: dict[str, Quantity] = Field(default_factory=dict)

    @field_validator("limits", "requests")
    @classmethod
    def _quantities(cls, values: dict[str, Quantity]) -> dict[str, Quantity]:
        bad = [f"{name}: {problem}" for name, value in values.items() if (problem := resource_problem(name, value))]
        if bad:
            raise ValueError("; ".join(bad))
        return values

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourcesSpec:
        if problem := requests_over_limits(self.requests, self.limits):
            raise ValueError(problem)
        names = {*self.requests, *self.limits}
        if any(n.startswith("hugepages-") for n in names) and not names & {"cpu", "memory"}:
            raise ValueError("hugepages need a cpu or memory request or limit beside them (a Kubernetes rule)")
        return self


class LocalObjectReference(SpecModel):
    # As a pod's imagePullSecrets entry: a Secret in the cluster's namespace.
    name: str = Field(min_length=1)


class PlacementSpec(SpecModel):
    """Where a role's pods may run and what they carry, as in a pod spec: the engine pools and the
    gateway. Pod labels and annotations the operator sets are refused in render/overrides.py."""
    node_selector: LabelMap = Field(default_factory=dict, description="the pods' nodeSelector")
    tolerations: tuple[Toleration, ...] = Field(
        default_factory=tuple,
        description="the pods' tolerations: Kubernetes' Toleration, no other keys (a key-less one needs operator "
                    "Exists; tolerationSeconds needs effect NoExecute)")
    affinity: Affinity | None = Field(
        default=None, description="the pods' affinity: nodeAffinity, podAffinity, podAntiAffinity (their "
                                  "scheduling terms as in a pod spec)")
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="the pods' PriorityClass (e.g. one that lets GPU pods preempt batch work); it must exist, or "
                    "the pods are not created (the StatefulSet's or ReplicaSet's events say why)")
    topology_spread_constraints: tuple[TopologySpreadConstraint, ...] = Field(
        default_factory=tuple,
        description="the pods' topologySpreadConstraints, Kubernetes' fields only; without a labelSelector a "
                    "constraint counts this role's own pods (laps.io/cluster, laps.io/role)")
    pod_labels: PodLabelMap = Field(
        default_factory=dict,
        description="labels on the pods (the template: a change rolls them); none of the operator's "
                    "(app.kubernetes.io/name|instance|component|managed-by) and no laps.io/ key")
    pod_annotations: AnnotationMap = Field(
        default_factory=dict,
        description="annotations on the pods (the template: a change rolls them); no laps.io/ key")

    @field_validator("topology_spread_constraints")
    @classmethod
    def _one_per_key_and_action(cls, constraints: tuple[TopologySpreadConstraint, ...]
                                ) -> tuple[TopologySpreadConstraint, ...]:
        # The API server's rule: a (topologyKey, whenUnsatisfiable) pair at most once.
        pairs = [(c.topology_key, c.when_unsatisfiable) for c in constraints]
        if len(set(pairs)) != len(pairs):
            raise ValueError("must not repeat a topologyKey with the same whenUnsatisfiable")
        return constraints


Replicas = Annotated[int, Field(ge=1, le=256, description="engine pods in the pool")]


class PoolSpec(PlacementSpec):
    """An engine pool: spec.decode (spec.prefill is a PrefillSpec)."""
    replicas: Replicas = 1
    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64,
        description="GPUs each engine shards the model over (SGLang's --tp-size; above 1 needs engine.backend "
                    "sglang)")
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec,
        description="the engine containers' resources; with backend sglang or device cuda, an nvidia.com/gpu left "
                    "out is set to what one engine uses")


class PrefillSpec(PoolSpec):
    """spec.prefill: one pod per group at least, by default."""
    replicas: Replicas = 2
