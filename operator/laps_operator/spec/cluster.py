"""Typed, defaulted view of a LAPSCluster's `spec`, and the source of the CRD's schema.

The CRD's schema (charts/laps/crds/lapscluster.yaml) is generated from these models (crd.py):
each default, bound, pattern and cross-field rule is written here once, and both the API server
and this module enforce it. The operator checks again because it must behave the same where
nothing validated the object (an emulator, a server that lost the CEL rules, an old CRD). A
failure here becomes the InvalidSpec condition's message, so messages name the field the user
has to fix. The sections about what the pods run and where (model, engine, pools) are in
pods.py, their placement in placement.py, the network policies' peers in network.py; what the
spec may not take back from the operator is checked against the builders, in
render/overrides.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from laps_agent.policy.allocation import DEFAULT_INTERVAL_S, AllocationConfig
from laps_agent.policy.classes import DEFAULT_LENGTH_THRESHOLD, LONG, SHORT
from laps_agent.policy.planner import PlannerConfig
from laps_agent.policy.scheduling.buckets import DEFAULT_BATCH_SIZES, DEFAULT_SEQ_LENGTHS
from laps_agent.policy.scheduling.config import LONG_WAIT_SLO_SHARE, SchedulerConfig, slo_long_wait_ms
from laps_agent.policy.slo import DEFAULT_ITL_SLO_S, DEFAULT_TTFT_SLO_S
from laps_operator.spec.formats import PROMETHEUS_URL_PATTERN, url_problem
from laps_operator.spec.gpus import gpu_count_problem
from laps_operator.spec.network import NetworkPolicySpec
from laps_operator.spec.placement import AnnotationMap
from laps_operator.spec.placement import SpecModel as _Model
from laps_operator.spec.pods import (
    DEFAULT_IMAGE,
    EngineSpec,
    LocalObjectReference,
    ModelSpec,
    PlacementSpec,
    PoolSpec,
    PrefillSpec,
    ResourcesSpec,
)

# The data plane's own defaults (laps_agent.policy): a knob left out of the CR runs the engines,
# the plugin and the allocation policy as `laps engine`, `laps local` and `laps sim` do.
_SCHEDULER = SchedulerConfig()
_ALLOCATION = AllocationConfig()
_PLANNER = PlannerConfig()


# What a drained process keeps of its pod's grace period to exit (the engine loop's last
# iteration, interpreter and device teardown) before the kubelet's SIGKILL.
EXIT_MARGIN_SECONDS = 3


@dataclass(frozen=True)
class Rule:
    """A rule across fields: `cel` for the API server (x-kubernetes-validations on spec), and the
    message both it and ClusterSpec._cross_field_rules give. `field` is where it points."""
    cel: str
    message: str
    field: str


ALLOCATION_NEEDS_TWO = Rule(
    "!self.laps.allocation.enabled || self.prefill.replicas >= 2",
    "laps.allocation.enabled needs prefill.replicas >= 2 (one pod per group at least)",
    ".laps.allocation.enabled")
ALLOCATION_MIN_PER_GROUP = Rule(
    "!self.laps.allocation.enabled || self.prefill.replicas >= 2 * self.laps.allocation.minPerGroup",
    "prefill.replicas must be at least 2 * laps.allocation.minPerGroup",
    ".laps.allocation.minPerGroup")
TENSOR_PARALLEL_NEEDS_SGLANG = Rule(
    "self.engine.backend == 'sglang' || (self.prefill.tensorParallelSize == 1 && self.decode.tensorParallelSize == 1)",
    "tensorParallelSize > 1 needs engine.backend sglang (the builtin engine runs one device per pod)",
    ".engine.backend")
GRACE_COVERS_PRE_STOP = Rule(
    f"self.drain.gracePeriodSeconds >= self.drain.preStopSeconds + {EXIT_MARGIN_SECONDS + 1}",
    f"drain.gracePeriodSeconds must be at least drain.preStopSeconds + {EXIT_MARGIN_SECONDS + 1} (1 s to finish "
    f"requests, {EXIT_MARGIN_SECONDS} s to exit)",
    ".drain.gracePeriodSeconds")
PREFIX_AFFINITY_NEEDS_CACHE = Rule(
    "!has(self.laps.prefixAffinity) || !self.laps.prefixAffinity || self.laps.prefixCache",
    "laps.prefixAffinity routes a prompt to the prefill pod expected to hold its prefix: it needs "
    "laps.prefixCache (leave laps.prefixAffinity unset or false)",
    ".laps.prefixAffinity")
PREFIX_WARM_NEEDS_BUILTIN = Rule(
    "!has(self.laps.prefixWarm) || !self.laps.prefixWarm || self.engine.backend != 'sglang'",
    "laps.prefixWarm (prefix warming) needs engine.backend builtin: SGLang has no warm endpoint "
    "(leave laps.prefixWarm unset or false)",
    ".laps.prefixWarm")
PREFIX_WARM_NEEDS_AFFINITY = Rule(
    "!has(self.laps.prefixWarm) || !self.laps.prefixWarm || "
    "(has(self.laps.prefixAffinity) ? self.laps.prefixAffinity : self.laps.prefixCache)",
    "laps.prefixWarm caches a turn's answer on the prefill pod that served it, for the chat's next "
    "turn, which only cache affinity sends back there: it needs laps.prefixAffinity (unset: "
    "laps.prefixCache) (leave laps.prefixWarm unset or false)",
    ".laps.prefixWarm")
# Rules for fields that would otherwise be accepted and ignored.
RATE_NEEDS_KEYS = Rule(
    "self.gateway.rateLimitPerKey <= 0.0 || has(self.gateway.apiKeysSecret)",
    "gateway.rateLimitPerKey counts requests per API key: it needs gateway.apiKeysSecret",
    ".gateway.rateLimitPerKey")
QUEUE_NEEDS_BUILTIN = Rule(
    "!has(self.engine.maxQueuedRequests) || self.engine.backend != 'sglang'",
    "engine.maxQueuedRequests bounds the builtin engine's queue: it needs engine.backend builtin "
    "(SGLang's own flags go in engine.extraArgs)",
    ".engine.maxQueuedRequests")
QUERY_NEEDS_PROMETHEUS = Rule(
    "!has(self.monitoring.pressureQuery) || self.monitoring.prometheusURL != ''",
    "monitoring.pressureQuery is a Prometheus query: it needs monitoring.prometheusURL (without it "
    "the allocation loop reads the gateways' /metrics)",
    ".monitoring.pressureQuery")
AUTOSCALING_NEEDS_PROMETHEUS = Rule(
    "!self.autoscaling.enabled || self.monitoring.prometheusURL != ''",
    "autoscaling.enabled needs monitoring.prometheusURL (the planner reads the gateways' arrivals and the "
    "engines' costs from Prometheus)",
    ".autoscaling.enabled")
AUTOSCALING_PREFILL_RANGE = Rule(
    "self.autoscaling.prefill.min <= self.autoscaling.prefill.max",
    "autoscaling.prefill.min must be <= autoscaling.prefill.max", ".autoscaling.prefill.min")
AUTOSCALING_DECODE_RANGE = Rule(
    "self.autoscaling.decode.min <= self.autoscaling.decode.max",
    "autoscaling.decode.min must be <= autoscaling.decode.max", ".autoscaling.decode.min")
AUTOSCALING_KEEPS_GROUPS = Rule(
    "!self.autoscaling.enabled || !self.laps.allocation.enabled || "
    "self.autoscaling.prefill.min >= 2 * self.laps.allocation.minPerGroup",
    "with laps.allocation.enabled, autoscaling.prefill.min must be at least 2 * laps.allocation.minPerGroup "
    "(the planner never leaves a group short of its pods)", ".autoscaling.prefill.min")
RULES = (ALLOCATION_NEEDS_TWO, ALLOCATION_MIN_PER_GROUP, TENSOR_PARALLEL_NEEDS_SGLANG, GRACE_COVERS_PRE_STOP,
         PREFIX_AFFINITY_NEEDS_CACHE, PREFIX_WARM_NEEDS_BUILTIN, PREFIX_WARM_NEEDS_AFFINITY, RATE_NEEDS_KEYS,
         QUEUE_NEEDS_BUILTIN, QUERY_NEEDS_PROMETHEUS, AUTOSCALING_NEEDS_PROMETHEUS, AUTOSCALING_PREFILL_RANGE,
         AUTOSCALING_DECODE_RANGE, AUTOSCALING_KEEPS_GROUPS)


class SchedulerSpec(_Model):
    enabled: bool = Field(default=_SCHEDULER.enabled,
                          description="dual-queue short-first prefill scheduling (false: FIFO)")
    wait_window_ms: float = Field(default=_SCHEDULER.wait_window_ms, ge=0, le=10000,
                                  description="how long a short request may wait for others to batch with (0: off)")
    wait_max_batch: int = Field(default=_SCHEDULER.wait_max_batch, ge=1, le=1024,
                                description="dispatch at once when this many short requests wait")
    adaptive_window: bool = Field(default=_SCHEDULER.adaptive_window,
                                  description="tune window, target depth and short-batch size from observed "
                                              "arrivals and batch costs")
    max_long_wait_ms: float | None = Field(
        default=None, ge=0,
        description=f"starvation bound: a long request waiting this long runs next (unset: "
                    f"{_SCHEDULER.max_long_wait_ms:g} ms, or {LONG_WAIT_SLO_SHARE:.2g} of "
                    f"slo.ttftP90Seconds.long where that is less)")
    max_long_batch_tokens: int = Field(default=_SCHEDULER.max_long_batch_tokens, ge=0, le=1048576,
                                       description="uncached tokens of a long prefill batch at most (0: the "
                                                   "whole batch budget): a short request arriving behind a "
                                                   "long batch waits for one")


# The largest bucket of the batch-prefill grid in each dimension (the CRD's item maximum).
MAX_GRAPH_BATCH_SIZE = 4096
MAX_GRAPH_SEQ_LENGTH = 1048576
_BY_GRID_FIELD = {"batch_sizes": MAX_GRAPH_BATCH_SIZE, "seq_lengths": MAX_GRAPH_SEQ_LENGTH}
# In the CRD: a set of items within bounds (_positive_unique says which rule a value breaks).
_GRAPH_SET = {"x-kubernetes-list-type": "set"}
_BatchSize = Annotated[int, Field(json_schema_extra={"minimum": 1, "maximum": MAX_GRAPH_BATCH_SIZE})]
_SeqLength = Annotated[int, Field(json_schema_extra={"minimum": 1, "maximum": MAX_GRAPH_SEQ_LENGTH})]


class BatchPrefillGraphsSpec(_Model):
    enabled: bool = Field(default=True, description="run short batches in fixed (batch, length) buckets (CUDA "
                                                    "graphs on GPU)")
    batch_sizes: tuple[_BatchSize, ...] = Field(default=DEFAULT_BATCH_SIZES, min_length=1, max_length=32,
                                                json_schema_extra=_GRAPH_SET,
                                                description="the bucket grid's batch sizes")
    seq_lengths: tuple[_SeqLength, ...] = Field(default=DEFAULT_SEQ_LENGTHS, min_length=1, max_length=64,
                                                json_schema_extra=_GRAPH_SET,
                                                description="the bucket grid's sequence lengths (tokens)")

    @field_validator("batch_sizes", "seq_lengths")
    @classmethod
    def _positive_unique(cls, values: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        if any(v < 1 for v in values):
            raise ValueError("must be positive integers")
        limit = _BY_GRID_FIELD[info.field_name]
        if max(values) > limit:
            raise ValueError(f"values must be <= {limit}")
        if len(set(values)) != len(values):
            raise ValueError("must not repeat a value")
        # Engines expect ascending grids; order in the CR is not meaningful.
        return tuple(sorted(values))


class AllocationSpec(_Model):
    # Off unless asked for: moving pods changes how a cluster serves, and `enabled` needs
    # prefill.replicas >= 2 (a default of true would make every one-pod pool invalid).
    enabled: bool = Field(default=False, description="move prefill pods between the groups from their pressure")
    interval_seconds: float = Field(default=DEFAULT_INTERVAL_S, ge=1, le=3600,
                                    description="one decision per interval, on the pressure averaged over it")
    ratio: float = Field(default=_ALLOCATION.ratio, ge=1,
                         description="move when one group's per-pod pressure is ratio times the other's (ratio^2 "
                                     "to undo the last move)")
    min_per_group: int = Field(default=_ALLOCATION.min_per_group, ge=1, description="pods each group keeps")
    cooldown_seconds: float = Field(default=_ALLOCATION.pod_cooldown_s, ge=0,
                                    description="a pod that moved stays in its new group at least this long")
    confirm_intervals: int = Field(default=_ALLOCATION.confirm, ge=1,
                                   description="the same move must be wanted in this many consecutive intervals")


class LapsSpec(_Model):
    length_threshold: int = Field(default=DEFAULT_LENGTH_THRESHOLD, ge=1,
                                  description="prompts with at most this many uncached tokens are short, longer "
                                              "ones long")
    # Strict, as the CRD's `type: boolean`: 0 or "no" is a mistake, not false.
    prefix_cache: StrictBool = Field(
        default=True,
        description="engines keep the KV of earlier prompts and prefill only the uncached rest of a later prompt "
                    "with the same beginning (builtin --prefix-cache; sglang: false renders --disable-radix-cache)")
    # None (unset): follows prefix_cache, so turning the cache off alone is enough.
    prefix_affinity: StrictBool | None = Field(
        default=None,
        description="the gateway sends a prompt to the prefill pod expected to hold its prefix and classifies it "
                    "by the tokens left to prefill there (--prefix-affinity); unset: the same as prefixCache; true "
                    "needs prefixCache")
    # None (unset): follows `affinity` on the builtin backend, off on sglang (ClusterSpec.warm).
    prefix_warm: StrictBool | None = Field(
        default=None,
        description="a decode engine sends a finished request's prompt and answer back to the prefill engine that "
                    "served it, which computes their KV when idle, so a chat's next turn prefills only its new "
                    "message there (--prefix-warm, engines and gateway); unset: the same as prefixAffinity on the "
                    "builtin backend, false on sglang; true needs prefixAffinity and the builtin backend")
    scheduler: SchedulerSpec = Field(default=SchedulerSpec(), description="the prefill engines' LAPS scheduler")
    batch_prefill_graphs: BatchPrefillGraphsSpec = Field(
        default=BatchPrefillGraphsSpec(), description="the short batches' bucket grid (prefill engines)")
    allocation: AllocationSpec = Field(
        default=AllocationSpec(),
        description="the closed loop moving prefill pods between the short and long groups from their pressure "
                    "(needs prefill.replicas >= 2; off by default: moving pods changes how the cluster serves)")

    @property
    def affinity(self) -> bool:
        """Whether the gateway routes by cache affinity (prefixAffinity, else prefixCache)."""
        return self.prefix_cache if self.prefix_affinity is None else self.prefix_affinity


class ApiKeysSecretSpec(_Model):
    # A Secret in the cluster's namespace; its `key` holds the API keys, one a line.
    name: str = Field(min_length=1)
    key: str = Field(default="api-keys", min_length=1)


class GatewaySpec(PlacementSpec):  # placed and labelled like the engine pools
    replicas: int = Field(default=1, ge=0, le=64, description="gateway pods")
    image: str = Field(default=DEFAULT_IMAGE, min_length=1,
                       description="image with the `laps` command (the engine image may be SGLang's)")
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="the type of the gateway's Service")
    # The gateway Service's: what a cloud's load balancer is asked for (internal, ...).
    service_annotations: AnnotationMap = Field(
        default_factory=dict,
        description="annotations on the gateway Service, e.g. for an internal load balancer "
                    "(service.beta.kubernetes.io/aws-load-balancer-scheme: internal); no laps.io/ key. A change "
                    "restarts no pod")
    port: int = Field(default=8000, ge=1, le=65535, description="the gateway Service's port")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="the gateway containers' resources")
    request_deadline_seconds: float = Field(  # --request-deadline-s
        default=600.0, ge=0,
        description="total time a request may take through the gateway, arrival to last byte; beyond, 504 (a "
                    "stream already begun ends with an SSE error event); 0 = none")
    # API keys (laps_agent/gateway/http/auth.py); None: no authentication.
    api_keys_secret: ApiKeysSecretSpec | None = Field(
        default=None,
        description="API keys: a Secret in this namespace whose key holds them, one a line; it is mounted "
                    "read-only in the gateway, which then answers 401 to a request without `Authorization: Bearer "
                    "<one of them>` (/health, /live, /metrics stay open). Absent = no authentication")
    # Admission control (laps_agent/policy/admission.py); None: the gateway's own default,
    # which lives there only.
    max_pending_tokens_per_pod: int | None = Field(
        default=None, ge=0,
        description="admission control: a prefill group takes new requests while its pending prompt tokens are "
                    "below this many per pod; beyond, its class gets 429 + Retry-After while the other class is "
                    "served (a pod that reports what it prefills in time also takes a request only if it fits with "
                    "its queue); 0 means no bound, neither of them. Unset: laps gateway's default")
    max_decode_share: float | None = Field(
        default=None, ge=0, le=1,
        description="admission control: the share of the decode pool's slots (its engines' max running requests) "
                    "one class may hold; beyond, that class gets 429 + Retry-After, so a flood of one class never "
                    "takes every decode slot from the other; 0 means no bound. Unset: laps gateway's default")
    rate_limit_per_key: float = Field(
        default=0.0, ge=0,
        description="requests/s each API key may send (burst: one second's worth, at least 1); beyond, 429 + "
                    "Retry-After; 0 = none. Needs apiKeysSecret")

    @model_validator(mode="after")
    def _rate_needs_keys(self) -> GatewaySpec:
        if self.rate_limit_per_key > 0 and self.api_keys_secret is None:
            raise ValueError(RATE_NEEDS_KEYS.message)
        return self


class DrainSpec(_Model):
    grace_period_seconds: int = Field(
        default=60, ge=5, le=86400,
        description="the pods' terminationGracePeriodSeconds (deletion to SIGKILL); the processes drain for what "
                    "is left after preStopSeconds and 3 s to exit (--drain-grace-s)")
    pre_stop_seconds: int = Field(
        default=5, ge=0, le=300,
        description="seconds the pod serves on after deletion before SIGTERM, while the endpoints controllers "
                    "take it out of every Service (0 = no preStop hook)")

    @property
    def process_grace_seconds(self) -> int:
        """What the engines and the gateway get as --drain-grace-s: the rest of the grace period."""
        return self.grace_period_seconds - self.pre_stop_seconds - EXIT_MARGIN_SECONDS


class MonitoringSpec(_Model):
    # The pattern is the CRD's; url_problem checks it (and more), saying what is wrong.
    prometheus_url: str = Field(
        default="", alias="prometheusURL", json_schema_extra={"pattern": PROMETHEUS_URL_PATTERN},
        description='Prometheus base URL the allocation loop queries for pressure ("" = read the gateway pods\' '
                    '/metrics directly)')
    pod_monitor: bool = Field(default=False, description="create a monitoring.coreos.com/v1 PodMonitor for "
                                                         "engines and gateway")
    pressure_query: str | None = Field(  # unset: the built-in query ("" is a mistake)
        default=None, min_length=1,
        description='PromQL (instant query) overriding the built-in pressure query (needs prometheusURL; unset = '
                    'the built-in one); it must return an instant vector with one series per group labelled '
                    'group="short" and group="long" (the class\'s offered prefill work summed over gateway '
                    'replicas, in the unit of the built-in query: seconds of prefill work per second)')

    @field_validator("prometheus_url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        if problem := url_problem(url):
            raise ValueError(problem)
        return url


class TtftSloSpec(_Model):
    short: float = Field(default=DEFAULT_TTFT_SLO_S[SHORT], ge=0.001, le=3600, description="seconds, short prompts")
    long: float = Field(default=DEFAULT_TTFT_SLO_S[LONG], ge=0.001, le=3600, description="seconds, long prompts")


class SloSpec(_Model):
    ttft_p90_seconds: TtftSloSpec = Field(default=TtftSloSpec(), description="time to first token, p90, per class")
    itl_p90_seconds: float = Field(default=DEFAULT_ITL_SLO_S, ge=0.001, le=60,
                                   description="inter-token latency, p90")


class PoolRangeSpec(_Model):
    min: int = Field(default=1, ge=1, le=1024, description="fewest pods")
    max: int = Field(default=_PLANNER.max_prefill, ge=1, le=1024, description="most pods")


class AutoscalingSpec(_Model):
    # Off unless asked for: with it on, the pools' replica counts are the planner's, not the spec's.
    enabled: bool = Field(default=False, description="size the prefill and decode pools from the SLOs (off: the "
                                                     "spec's replicas, untouched)")
    interval_seconds: float = Field(default=_PLANNER.interval_s, ge=1, le=3600,
                                    description="one decision per interval, on the arrivals of the last one")
    gpu_budget: int | None = Field(default=None, ge=1, le=100000,
                                   description="GPUs of both pools together, never exceeded (pods still draining "
                                               "count); unset: no budget")
    prefill: PoolRangeSpec = Field(default=PoolRangeSpec(), description="the prefill pool's range")
    decode: PoolRangeSpec = Field(default=PoolRangeSpec(max=_PLANNER.max_decode), description="the decode pool's range")
    max_step: int = Field(default=_PLANNER.max_step, ge=1, le=1024, description="pods per pool per decision, each way")
    scale_down_stabilization_seconds: float = Field(
        default=_PLANNER.scale_down_stabilization_s, ge=0, le=86400,
        description="a pool shrinks only to the highest need of this window")
    startup_seconds: float = Field(default=_PLANNER.startup_s, ge=0, le=7200,
                                   description="from ordering a pod to its serving (model load): a rising load is "
                                               "planned this far ahead")


class ClusterSpec(_Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": r.cel, "message": r.message, "fieldPath": r.field} for r in RULES]})

    model: ModelSpec = Field(description="the model the engines serve")
    engine: EngineSpec = Field(default=EngineSpec(), description="what the engine pods run")
    prefill: PrefillSpec = Field(default=PrefillSpec(), description="the prefill pool, split into the short and "
                                                                    "long groups")
    decode: PoolSpec = Field(default=PoolSpec(), description="the decode pool")
    laps: LapsSpec = Field(default=LapsSpec(), description="Length-Aware Prefill Scheduling: the classes, the "
                                                           "scheduler, the allocation loop")
    gateway: GatewaySpec = Field(default=GatewaySpec(), description="the gateway pods and their Service")
    slo: SloSpec = Field(default=SloSpec(), description="the service level: the planner sizes the pools for it, the "
                                                       "gateway places long prompts by the short one")
    autoscaling: AutoscalingSpec = Field(
        default=AutoscalingSpec(),
        description="the planner: prefill and decode replica counts from the SLOs, within a GPU budget (off by "
                    "default; on, the spec's replicas are where it starts)")
    drain: DrainSpec = Field(
        default=DrainSpec(),
        description="graceful shutdown of engine and gateway pods: a preStop delay while the pod is taken out of "
                    "its Services, then on SIGTERM unready at once, new requests refused (503 draining, retried on "
                    "other pods by the gateway), the held ones finished")
    monitoring: MonitoringSpec = Field(default=MonitoringSpec(), description="where pressure is read, and "
                                                                             "Prometheus scraping")
    network_policy: NetworkPolicySpec = Field(
        default=NetworkPolicySpec(),
        description="NetworkPolicies (ingress) around the cluster's pods: engines' http and bootstrap ports only "
                    "from the cluster's own gateway and engine pods, the gateway's port from gatewayIngress; the "
                    "HTTP ports (/metrics) also from metricsFrom")
    # Every pod's imagePullSecrets (engines and gateway): images from private registries. A
    # pod's imagePullSecrets is a list keyed by name, as is the CRD's.
    image_pull_secrets: tuple[LocalObjectReference, ...] = Field(
        default_factory=tuple,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Secrets (in this namespace) holding credentials for the registries of the engine and gateway "
                    "images: every pod's imagePullSecrets")

    @field_validator("image_pull_secrets")
    @classmethod
    def _unique_secrets(cls, refs: tuple[LocalObjectReference, ...]) -> tuple[LocalObjectReference, ...]:
        names = [ref.name for ref in refs]
        if len(set(names)) != len(names):
            raise ValueError("must not name a Secret twice")
        return refs

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ClusterSpec:
        # RULES, as the API server evaluates their CEL.
        alloc = self.laps.allocation
        broken = [
            (ALLOCATION_NEEDS_TWO, alloc.enabled and self.prefill.replicas < 2),
            (ALLOCATION_MIN_PER_GROUP, alloc.enabled and self.prefill.replicas < 2 * alloc.min_per_group),
            (GRACE_COVERS_PRE_STOP, self.drain.process_grace_seconds < 1),
            (PREFIX_AFFINITY_NEEDS_CACHE, self.laps.prefix_affinity is True and not self.laps.prefix_cache),
            (PREFIX_WARM_NEEDS_BUILTIN, self.laps.prefix_warm is True and self.engine.backend == "sglang"),
            (PREFIX_WARM_NEEDS_AFFINITY, self.laps.prefix_warm is True and not self.laps.affinity),
            (TENSOR_PARALLEL_NEEDS_SGLANG, self.engine.backend != "sglang" and (
                self.prefill.tensor_parallel_size != 1 or self.decode.tensor_parallel_size != 1)),
            (QUEUE_NEEDS_BUILTIN, self.engine.max_queued_requests is not None and self.engine.backend == "sglang"),
            (QUERY_NEEDS_PROMETHEUS, self.monitoring.pressure_query is not None and not self.monitoring.prometheus_url),
            (AUTOSCALING_NEEDS_PROMETHEUS, self.autoscaling.enabled and not self.monitoring.prometheus_url),
            (AUTOSCALING_PREFILL_RANGE, self.autoscaling.prefill.min > self.autoscaling.prefill.max),
            (AUTOSCALING_DECODE_RANGE, self.autoscaling.decode.min > self.autoscaling.decode.max),
            (AUTOSCALING_KEEPS_GROUPS, self.autoscaling.enabled and alloc.enabled
             and self.autoscaling.prefill.min < 2 * alloc.min_per_group),
        ]  # and RATE_NEEDS_KEYS, in GatewaySpec
        for rule, is_broken in broken:
            if is_broken:
                raise ValueError(rule.message)
        for role, pool in (("prefill", self.prefill), ("decode", self.decode)):
            if problem := gpu_count_problem(role, self.engine, pool):
                raise ValueError(problem)
        return self

    @property
    def max_long_wait_ms(self) -> float:
        """The prefill engines' starvation bound: laps.scheduler.maxLongWaitMs, else the long TTFT
        SLO's share (slo_long_wait_ms), so that a tighter SLO is not missed by design."""
        if self.laps.scheduler.max_long_wait_ms is not None:
            return self.laps.scheduler.max_long_wait_ms
        return slo_long_wait_ms(self.slo.ttft_p90_seconds.long)

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
    """Validate and default a CR's `spec` as the CRD does (its fields and RULES); raise
    InvalidSpecError with a readable message. What the spec may not take back from the operator
    is read off the builders: render.overrides.parse_checked_spec adds that."""
    if not isinstance(raw, dict):
        raise InvalidSpecError("spec: must be an object")
    try:
        return ClusterSpec.model_validate(raw)
    except ValidationError as exc:
        raise InvalidSpecError(format_errors(exc)) from None


def format_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"spec.{where}: {msg}" if where else f"spec: {msg}")
    return "; ".join(parts)
