"""The sections of a LAPSCluster's spec that say what its pods run and where: the model, the
engine (image, backend), and each pool's size, resources and placement. spec.py assembles them
with the LAPS knobs into ClusterSpec; the same camelCase aliases and strictness apply.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .formats import quantity_problem, requests_over_limits

Quantity = int | str  # as the CRD: x-kubernetes-int-or-string


class SpecModel(BaseModel):
    # camelCase in the CR, snake_case in Python; unknown keys are typos worth reporting.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class ModelSpec(SpecModel):
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    served_name: str | None = None
    volume: dict[str, Any] | None = None
    mount_path: str = "/models"

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

    @field_validator("env")
    @classmethod
    def _env_has_names(cls, env: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        for item in env:
            if not isinstance(item.get("name"), str) or not item["name"]:
                raise ValueError("every env entry needs a non-empty 'name'")
        return env


class ResourcesSpec(SpecModel):
    limits: dict[str, Quantity] = Field(default_factory=dict)
    requests: dict[str, Quantity] = Field(default_factory=dict)

    @field_validator("limits", "requests")
    @classmethod
    def _quantities(cls, values: dict[str, Quantity]) -> dict[str, Quantity]:
        bad = [f"{name}: {problem}" for name, value in values.items() if (problem := quantity_problem(value))]
        if bad:
            raise ValueError("; ".join(bad))
        return values

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourcesSpec:
        if problem := requests_over_limits(self.requests, self.limits):
            raise ValueError(problem)
        return self


class PoolSpec(SpecModel):
    replicas: int = Field(default=1, ge=1, le=256)
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    resources: ResourcesSpec = ResourcesSpec()
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None
