"""The sections of a LAPSCluster's spec that say what its pods run and where: the model, the
engine (image, backend), each pool's size and resources, and the placement (nodeSelector,
tolerations, affinity, priority, topology spread: their parts in spec_placement.py) and pod
labels and annotations that the pools and the gateway share. spec.py assembles them with the LAPS knobs into ClusterSpec; the same
camelCase aliases and strictness apply.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from laps_operator.spec.formats import DNS_SUBDOMAIN_PATTERN, env_name_problem, requests_over_limits, resource_problem
from laps_operator.spec.placement import (
    Affinity,
    AnnotationMap,
    LabelMap,
    SpecModel,
    Toleration,
    TopologySpreadConstraint,
)

Quantity = int | str  # as the CRD: x-kubernetes-int-or-string


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
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    served_name: str | None = None
    volume: dict[str, Any] | None = None
    mount_path: str = "/models"

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
SGLANG_TRANSFER_BACKENDS = ("mooncake", "mooncake_tcp", "nixl", "ascend", "mori")


class SGLangSpec(SpecModel):
    # How a SGLang prefill pod hands its KV to decode (backend sglang only).
    transfer_backend: Literal["mooncake", "mooncake_tcp", "nixl", "ascend", "mori"] = "mooncake"


class EngineSpec(SpecModel):
    backend: Literal["builtin", "sglang"] = "builtin"
    sglang: SGLangSpec = SGLangSpec()
    image: str = Field(default="ghcr.io/laps-project/laps:0.1.0", min_length=1)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_queued_requests: int | None = Field(default=None, ge=0)
    extra_args: tuple[str, ...] = ()
    env: tuple[dict[str, Any], ...] = ()

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
    gateway. Pod labels and annotations the operator sets are refused in overrides.py."""
    node_selector: LabelMap = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    affinity: Affinity | None = None
    priority_class_name: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    topology_spread_constraints: tuple[TopologySpreadConstraint, ...] = ()
    pod_labels: LabelMap = Field(default_factory=dict)
    pod_annotations: AnnotationMap = Field(default_factory=dict)

    @field_validator("topology_spread_constraints")
    @classmethod
    def _one_per_key_and_action(cls, constraints: tuple[TopologySpreadConstraint, ...]
                                ) -> tuple[TopologySpreadConstraint, ...]:
        # The API server's rule: a (topologyKey, whenUnsatisfiable) pair at most once.
        pairs = [(c.topology_key, c.when_unsatisfiable) for c in constraints]
        if len(set(pairs)) != len(pairs):
            raise ValueError("must not repeat a topologyKey with the same whenUnsatisfiable")
        return constraints


class PoolSpec(PlacementSpec):
    replicas: int = Field(default=1, ge=1, le=256)
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    resources: ResourcesSpec = ResourcesSpec()
