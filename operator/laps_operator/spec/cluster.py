"""Typed, defaulted view of a LAPSCluster's `spec`.

The CRD's schema already defaults and validates on a real API server; this model repeats the
same defaults and rules so the operator behaves the same where nothing validated the object
(an emulator, a server that lost the CEL rules, an old CRD). A failure here becomes the
InvalidSpec condition's message, so messages name the field the user has to fix. The sections
about what the pods run and where (model, engine, pools) are in spec_pods.py, the network
policies' peers in spec_network.py.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from laps_operator.spec.formats import url_problem
from laps_operator.spec.gpus import gpu_count_problem
from laps_operator.spec.network import NetworkPolicySpec
from laps_operator.spec.placement import AnnotationMap
from laps_operator.spec.placement import SpecModel as _Model
from laps_operator.spec.pods import EngineSpec, LocalObjectReference, ModelSpec, PlacementSpec, PoolSpec, ResourcesSpec

GROUP = "laps.io"
VERSION = "v1alpha1"
KIND = "LAPSCluster"
PLURAL = "lapsclusters"


class SchedulerSpec(_Model):
    enabled: bool = True
    wait_window_ms: float = Field(default=5.0, ge=0, le=10000)
    wait_max_batch: int = Field(default=8, ge=1, le=1024)
    adaptive_window: bool = False
    max_long_wait_ms: float = Field(default=2000.0, ge=0)


class BatchPrefillGraphsSpec(_Model):
    enabled: bool = True
    batch_sizes: tuple[int, ...] = Field(default=(1, 2, 4, 8), min_length=1, max_length=32)
    seq_lengths: tuple[int, ...] = Field(default=(16, 32, 64, 128, 256), min_length=1, max_length=64)

    @field_validator("batch_sizes", "seq_lengths")
    @classmethod
    def _positive_unique(cls, values: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        if any(v < 1 for v in values):
            raise ValueError("must be positive integers")
        limit = 4096 if info.field_name == "batch_sizes" else 1048576  # the CRD's item maximum
        if max(values) > limit:
            raise ValueError(f"values must be <= {limit}")
        if len(set(values)) != len(values):
            raise ValueError("must not repeat a value")
        # Engines expect ascending grids; order in the CR is not meaningful.
        return tuple(sorted(values))


class AllocationSpec(_Model):
    # Off unless asked for: moving pods changes how a cluster serves, and `enabled` needs
    # prefill.replicas >= 2 (a default of true would make every one-pod pool invalid).
    enabled: bool = False
    interval_seconds: float = Field(default=5.0, ge=1, le=3600)
    ratio: float = Field(default=2.0, ge=1)
    min_per_group: int = Field(default=1, ge=1)
    cooldown_seconds: float = Field(default=60.0, ge=0)   # a moved pod stays this long
    confirm_intervals: int = Field(default=2, ge=1)       # the same move wanted this many times


class LapsSpec(_Model):
    length_threshold: int = Field(default=256, ge=1)
    # Engines keep the KV of earlier prompts (builtin --prefix-cache, SGLang's radix cache);
    # the gateway routes a prompt to the prefill pod expected to hold its prefix (--prefix-affinity).
    # Strict, as the CRD's `type: boolean`: 0 or "no" is a mistake, not false.
    prefix_cache: StrictBool = True
    # None (unset): follows prefix_cache, so turning the cache off alone is enough.
    prefix_affinity: StrictBool | None = None
    # Prefix warming (--prefix-warm, engines and gateway): a decode engine sends a finished
    # request's prompt + answer back to the prefill engine that served it, which computes their
    # KV when idle, so a chat's next turn prefills only its new message there. None (unset):
    # follows `affinity` on the builtin backend, off on sglang (ClusterSpec.warm).
    prefix_warm: StrictBool | None = None
    scheduler: SchedulerSpec = SchedulerSpec()
    batch_prefill_graphs: BatchPrefillGraphsSpec = BatchPrefillGraphsSpec()
    allocation: AllocationSpec = AllocationSpec()

    @property
    def affinity(self) -> bool:
        """Whether the gateway routes by cache affinity (prefixAffinity, else prefixCache)."""
        return self.prefix_cache if self.prefix_affinity is None else self.prefix_affinity


# Rules for fields that would otherwise be accepted and ignored (the CRD has the same messages).
RATE_NEEDS_KEYS = "gateway.rateLimitPerKey counts requests per API key: it needs gateway.apiKeysSecret"
QUEUE_NEEDS_BUILTIN = (
    "engine.maxQueuedRequests bounds the builtin engine's queue: it needs engine.backend builtin "
    "(SGLang's own flags go in engine.extraArgs)")
QUERY_NEEDS_PROMETHEUS = (
    "monitoring.pressureQuery is a Prometheus query: it needs monitoring.prometheusURL (without it "
    "the allocation loop reads the gateways' /metrics)")


class ApiKeysSecretSpec(_Model):
    # A Secret in the cluster's namespace; its `key` holds the API keys, one a line.
    name: str = Field(min_length=1)
    key: str = Field(default="api-keys", min_length=1)


class GatewaySpec(PlacementSpec):  # placed and labelled like the engine pools
    replicas: int = Field(default=1, ge=0, le=64)
    image: str = Field(default="ghcr.io/laps-project/laps:0.1.0", min_length=1)
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    # The gateway Service's: what a cloud's load balancer is asked for (internal, ...).
    service_annotations: AnnotationMap = Field(default_factory=dict)
    port: int = Field(default=8000, ge=1, le=65535)
    resources: ResourcesSpec = ResourcesSpec()
    request_deadline_seconds: float = Field(default=600.0, ge=0)  # 0: none (--request-deadline-s)
    # API keys (laps_agent/gateway/http/auth.py); None: no authentication.
    api_keys_secret: ApiKeysSecretSpec | None = None
    rate_limit_per_key: float = Field(default=0.0, ge=0)  # requests/s per key; 0: none
    # Admission control (laps_agent/policy/admission.py); None: the gateway's own default,
    # which lives there only.
    max_pending_tokens_per_pod: int | None = Field(default=None, ge=0)
    max_decode_share: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _rate_needs_keys(self) -> GatewaySpec:
        if self.rate_limit_per_key > 0 and self.api_keys_secret is None:
            raise ValueError(RATE_NEEDS_KEYS)
        return self


# What a drained process keeps of its pod's grace period to exit (the engine loop's last
# iteration, interpreter and device teardown) before the kubelet's SIGKILL.
EXIT_MARGIN_SECONDS = 3


class DrainSpec(_Model):
    # The pods' terminationGracePeriodSeconds: from deletion to SIGKILL, the pre-stop delay
    # included.
    grace_period_seconds: int = Field(default=60, ge=5, le=86400)
    # Before SIGTERM the pod serves on while the endpoints controllers take it out of every
    # Service and gateway (0: no preStop hook).
    pre_stop_seconds: int = Field(default=5, ge=0, le=300)

    @property
    def process_grace_seconds(self) -> int:
        """What the engines and the gateway get as --drain-grace-s: the rest of the grace period."""
        return self.grace_period_seconds - self.pre_stop_seconds - EXIT_MARGIN_SECONDS


class MonitoringSpec(_Model):
    prometheus_url: str = Field(default="", alias="prometheusURL")
    pod_monitor: bool = False
    pressure_query: str | None = Field(default=None, min_length=1)  # unset: the built-in query ("" is a mistake)

    @field_validator("prometheus_url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        if problem := url_problem(url):
            raise ValueError(problem)
        return url


PREFIX_AFFINITY_NEEDS_CACHE = (
    "laps.prefixAffinity routes a prompt to the prefill pod expected to hold its prefix: it needs "
    "laps.prefixCache (leave laps.prefixAffinity unset or false)")
PREFIX_WARM_NEEDS_AFFINITY = (
    "laps.prefixWarm caches a turn's answer on the prefill pod that served it, for the chat's next "
    "turn, which only cache affinity sends back there: it needs laps.prefixAffinity (unset: "
    "laps.prefixCache) (leave laps.prefixWarm unset or false)")
PREFIX_WARM_NEEDS_BUILTIN = (
    "laps.prefixWarm (prefix warming) needs engine.backend builtin: SGLang has no warm endpoint "
    "(leave laps.prefixWarm unset or false)")


class ClusterSpec(_Model):
    model: ModelSpec
    engine: EngineSpec = EngineSpec()
    prefill: PoolSpec = PoolSpec(replicas=2)
    decode: PoolSpec = PoolSpec(replicas=1)
    laps: LapsSpec = LapsSpec()
    gateway: GatewaySpec = GatewaySpec()
    drain: DrainSpec = DrainSpec()
    monitoring: MonitoringSpec = MonitoringSpec()
    network_policy: NetworkPolicySpec = NetworkPolicySpec()
    # Every pod's imagePullSecrets (engines and gateway): images from private registries.
    image_pull_secrets: tuple[LocalObjectReference, ...] = ()

    @field_validator("image_pull_secrets")
    @classmethod
    def _unique_secrets(cls, refs: tuple[LocalObjectReference, ...]) -> tuple[LocalObjectReference, ...]:
        # A pod's imagePullSecrets is a list keyed by name, as is the CRD's.
        names = [ref.name for ref in refs]
        if len(set(names)) != len(names):
            raise ValueError("must not name a Secret twice")
        return refs

    @field_validator("prefill", mode="before")
    @classmethod
    def _prefill_defaults_to_two(cls, value: Any) -> Any:
        # PoolSpec's own default is 1 (decode); the prefill pool defaults to one pod per group.
        if isinstance(value, dict) and "replicas" not in value:
            return {**value, "replicas": 2}
        return value

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ClusterSpec:
        # The same rules as the CRD's x-kubernetes-validations.
        alloc = self.laps.allocation
        if alloc.enabled and self.prefill.replicas < 2:
            raise ValueError("laps.allocation.enabled needs prefill.replicas >= 2 (one pod per group at least)")
        if alloc.enabled and self.prefill.replicas < 2 * alloc.min_per_group:
            raise ValueError("prefill.replicas must be at least 2 * laps.allocation.minPerGroup")
        if self.drain.process_grace_seconds < 1:
            # The same message as the CRD's rule, which cannot read EXIT_MARGIN_SECONDS.
            raise ValueError(f"drain.gracePeriodSeconds must be at least drain.preStopSeconds + "
                             f"{EXIT_MARGIN_SECONDS + 1} (1 s to finish requests, {EXIT_MARGIN_SECONDS} s to exit)")
        if self.laps.prefix_affinity is True and not self.laps.prefix_cache:
            raise ValueError(PREFIX_AFFINITY_NEEDS_CACHE)
        if self.laps.prefix_warm is True and self.engine.backend == "sglang":
            raise ValueError(PREFIX_WARM_NEEDS_BUILTIN)
        if self.laps.prefix_warm is True and not self.laps.affinity:
            raise ValueError(PREFIX_WARM_NEEDS_AFFINITY)
        if self.engine.backend != "sglang" and (
            self.prefill.tensor_parallel_size != 1 or self.decode.tensor_parallel_size != 1
        ):
            raise ValueError(
                "tensorParallelSize > 1 needs engine.backend sglang (the builtin engine runs one device per pod)"
            )
        if self.engine.max_queued_requests is not None and self.engine.backend == "sglang":
            raise ValueError(QUEUE_NEEDS_BUILTIN)
        if self.monitoring.pressure_query is not None and not self.monitoring.prometheus_url:
            raise ValueError(QUERY_NEEDS_PROMETHEUS)
        for role, pool in (("prefill", self.prefill), ("decode", self.decode)):
            if problem := gpu_count_problem(role, self.engine, pool):
                raise ValueError(problem)
        return self

    @property
    def warm(self) -> bool:
        """Whether engines and the gateway warm prefixes (prefixWarm, else the builtin backend's
        affinity; SGLang has no warm endpoint)."""
        if self.laps.prefix_warm is not None:
            return self.laps.prefix_warm
        return self.engine.backend != "sglang" and self.laps.affinity


class InvalidSpecError(ValueError):
    """The CR cannot be reconciled; `str()` is the message for the InvalidSpec condition."""


def parse_spec(raw: dict[str, Any] | None) -> ClusterSpec:
    """Validate and default a CR's `spec`; raise InvalidSpecError with a readable message."""
    if not isinstance(raw, dict):
        raise InvalidSpecError("spec: must be an object")
    try:
        spec = ClusterSpec.model_validate(raw)
    except ValidationError as exc:
        raise InvalidSpecError(format_errors(exc)) from None
    # What extraArgs, env and mountPath may not take back from the operator is read off the
    # builders, which import this module: hence the import here.
    from laps_operator.spec.overrides import override_problem

    if problem := override_problem(spec):
        raise InvalidSpecError(f"spec.{problem}")
    return spec


def format_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"spec.{where}: {msg}" if where else f"spec: {msg}")
    return "; ".join(parts)
