"""Typed settings of one gateway process (what `laps gateway` flags turn into)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from laps_agent.gateway.prefix import DEFAULT_RECORD_BLOCKS_PER_POD
from laps_agent.policy.admission import DEFAULT_MAX_DECODE_SHARE, DEFAULT_MAX_PENDING_TOKENS_PER_POD
from laps_agent.policy.classes import DEFAULT_LENGTH_THRESHOLD
from laps_agent.policy.outlier import DEFAULT_MAX_EJECTION_PERCENT
from laps_agent.policy.routing import DEFAULT_AFFINITY_BOUND, AffinityBound
from laps_agent.policy.slo import ttft_slos
from laps_agent.serving.drain import DEFAULT_GRACE_S
from laps_agent.serving.request_body import BODY_IDLE_TIMEOUT_S


@dataclass(frozen=True)
class ProxyConfig:
    connect_timeout_s: float = 5.0
    # The longest an engine may stay silent on an open request (time to the response head
    # included); None: see GatewayConfig.upstream_silence_s.
    read_timeout_s: float | None = None
    # The longest a streaming client may take no bytes (its connection backed up) before it is
    # dropped; None: see GatewayConfig.client_stall_s.
    client_stall_s: float | None = None
    # Retries on another pair of pods after a connection-level failure (nothing sent yet).
    max_retries: int = 2
    # A pod failing this many times in a row is ejected from routing for eject_seconds...
    eject_after_failures: int = 3
    eject_seconds: float = 10.0
    # ...unless that would take more than this share of its pool (prefill group or decode
    # pool) out, or its last healthy pod (policy/outlier.py); 0: never eject.
    max_ejection_percent: int = DEFAULT_MAX_EJECTION_PERCENT
    max_idle_connections_per_pod: int = 256


# Ten minutes: a long generation on a CPU takes a few; a request older than that is stuck.
DEFAULT_REQUEST_DEADLINE_S = 600.0
# The silence bound when neither --read-timeout nor a request deadline gives one.
DEFAULT_SILENCE_S = 300.0
MIN_CLIENT_STALL_S = 60.0


@dataclass(frozen=True)
class GatewayConfig:
    served_model_name: str = "default"
    length_threshold: int = DEFAULT_LENGTH_THRESHOLD
    max_body_bytes: int = 4 * 1024 * 1024
    # Seconds a client is told to wait (Retry-After) when no pod can take its request, or its
    # class is over its admission bound.
    retry_after_s: int = 1
    # Admission control (gateway/admission.py): a prefill group takes new requests while its
    # pending prompt tokens are below this many per routable pod; beyond, 429. 0: no bound.
    max_pending_tokens_per_pod: int = DEFAULT_MAX_PENDING_TOKENS_PER_POD
    # ...and each class may hold at most this share of the decode pool's slots (its decode
    # pods' reported max running requests); beyond, 429. 0: no bound.
    max_decode_share: float = DEFAULT_MAX_DECODE_SHARE
    # The TTFT SLO per class (spec.slo.ttftP90Seconds): routed by prediction, a long may take a
    # short-group pod whenever a short arriving behind its batch would still start in time
    # (policy/placement.py).
    ttft_slo_s: Mapping[str, float] = field(default_factory=ttft_slos)
    # The prefill router (policy/systems.py ROUTERS): "predicted" sends each request where its
    # predicted time to first token is lowest, the groups a preference (policy/placement.py);
    # "least-loaded" keeps it in its class's group, on the pod with the fewest pending tokens
    # (policy/routing.py: the baselines `vanilla-pd` and `reference` route so).
    router: str = "predicted"
    # Arrival to the last byte of the answer (gateway/deadline.py): beyond, 504 before the
    # first byte, or an SSE error event ending a stream. 0: no deadline.
    request_deadline_s: float = DEFAULT_REQUEST_DEADLINE_S
    # A request body that stops arriving for this long is answered 408 (laps_agent/serving/request_body.py).
    body_idle_timeout_s: float = BODY_IDLE_TIMEOUT_S
    # After SIGTERM: the most the gateway takes to finish the requests it holds (laps_agent/serving/drain.py).
    drain_grace_s: float = DEFAULT_GRACE_S
    # Engine-reported load (gateway/engine_load.py): poll every pod's /get_load this often and
    # route by it, so that several gateway replicas share what the engines hold. Off: each
    # routes by its own dispatches alone. A poll costs the engine ~0.15 ms of CPU and the
    # gateway ~0.1 ms (about 4x that when idle, caches cold), per pod and gateway replica;
    # between polls a gateway counts its own dispatches, so a burst is spread all the same.
    engine_load_poll: bool = True
    engine_load_interval_s: float = 0.25
    # API keys (gateway/auth.py): a file of keys, one a line; None: no authentication.
    api_keys_file: str | None = None
    # Requests/s per API key (token bucket, burst max(1, this)); 0: no limit. Needs api_keys_file.
    rate_limit_per_key: float = 0.0
    # Cache affinity (gateway/routing.py, affinity.py): route a prompt to the pod expected to
    # hold its prefix and classify it by the expected uncached length. Off: full-length classes,
    # least-loaded pods (the behaviour before issue 12).
    prefix_affinity: bool = True
    # When a pod holding the prefix loses affinity for being too loaded (routing.AffinityBound).
    affinity_bound: AffinityBound = DEFAULT_AFFINITY_BOUND
    # The record of what was sent where, per prefill pod, in blocks (a chat message or 256
    # characters each, gateway/prefix.py): about the prefix cache of one pod; a larger record
    # than the pod's cache only over-predicts hits, which laps_gateway_class_disagreements shows.
    prefix_record_blocks_per_pod: int = DEFAULT_RECORD_BLOCKS_PER_POD
    # The engines warm each prefill pod with the answers of the turns it served (their
    # --prefix-warm, engine/prefix_warm.py): a chat's previous answer counts as held there.
    prefix_warm: bool = False
    proxy: ProxyConfig = ProxyConfig()

    @property
    def upstream_silence_s(self) -> float:
        """How long an engine may stay silent on an open request before the gateway gives up on
        it (504, and a failure counted against the pod): --read-timeout when given, else the
        request deadline, else DEFAULT_SILENCE_S. Not shorter than the deadline by default: a
        non-streamed answer sends nothing until it is complete, so a fixed 300 s cut answers
        that the deadline (600 s by default) allows, and blamed a healthy pod for them."""
        if self.proxy.read_timeout_s is not None:
            return self.proxy.read_timeout_s
        return self.request_deadline_s if self.request_deadline_s > 0 else DEFAULT_SILENCE_S

    @property
    def client_stall_s(self) -> float:
        """How long a streaming client may take no bytes before its connection is dropped
        (gateway/relay.py): --client-stall-s when given, else the engines' silence bound but at
        least MIN_CLIENT_STALL_S: a short --read-timeout, set to catch hung engines, must not
        cut a client that pauses to work on what it got."""
        if self.proxy.client_stall_s is not None:
            return self.proxy.client_stall_s
        return max(self.upstream_silence_s, MIN_CLIENT_STALL_S)
