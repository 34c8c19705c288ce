"""What the planner observes, read from Prometheus: the arrivals per class, their tokens, the
work waiting, the decode pool's running requests and the prefill engines' measured cost.

One instant query per figure (`queries`), each over the cluster's own pods (the `namespace` and
`pod` labels of Kubernetes service discovery, as the allocation loop's pressure query):
- arrivals: rate of `laps_gateway_arrivals_total` by class (demand: refused requests too);
- tokens: rate of `laps_gateway_arrival_tokens_total` by class and kind (prompt, output);
- waiting: `laps_gateway_pending_requests` by group (dispatched, not yet prefilled);
- decode: `laps_engine_running_requests` of each decode pod (their sum; which to let go first);
- cost: `laps_engine_prefill_cost_seconds` by term, averaged over the prefill pods;
- decode_cost: `laps_engine_decode_cost_seconds` by term, averaged over the decode pods.
A figure that cannot be read makes the observation missing, with the reason (the planner freezes
and says so); a prefill cost not measured yet is "unknown" (also a freeze). Without a decode cost
(SGLang engines do not export one) decode is sized by its slots and its observed concurrency
(policy.planner.DEFAULT_DECODE_SLOTS). The pure part (`observation`) does no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from laps_agent.policy.classes import CLASSES
from laps_agent.policy.planner import DEFAULT_DECODE_SLOTS, ClassLoad, Observation, PodCosts
from laps_operator.allocation.pressure import MIN_WINDOW_S, TIMEOUT_S, deployment_pod_regex, gateway_pod_regex
from laps_operator.naming import ClusterRef

Samples = list[tuple[dict[str, str], float]]

@dataclass(frozen=True)
class Reading:
    observation: Observation | None
    costs: PodCosts | None
    reason: str = ""              # CamelCase, when the observation is missing (a condition's reason)
    message: str = ""
    decode_held: Mapping[str, float] = field(default_factory=dict)   # decode pod -> its running requests


def rate_window_s(window_s: float) -> float:
    """The seconds the rates are counted over (Prometheus needs two scrapes in the window)."""
    return max(window_s, MIN_WINDOW_S)


def queries(cluster: ClusterRef, window_s: float) -> dict[str, str]:
    ns = f'namespace="{cluster.namespace}"'
    gateways = f'{ns},pod=~"{gateway_pod_regex(cluster)}"'
    window = f"[{int(round(rate_window_s(window_s) * 1000))}ms]"
    return {
        "arrivals": f"sum by (class) (rate(laps_gateway_arrivals_total{{{gateways}}}{window}))",
        "tokens": f"sum by (class, kind) (rate(laps_gateway_arrival_tokens_total{{{gateways}}}{window}))",
        "waiting": f"sum by (group) (laps_gateway_pending_requests{{{gateways}}})",
        "decode": f'sum by (pod) (laps_engine_running_requests{{{ns},pod=~"{deployment_pod_regex(cluster.decode)}"}})',
        "cost": f'avg by (term) (laps_engine_prefill_cost_seconds{{{ns},pod=~"{cluster.prefill}-[0-9]+"}})',
        "decode_cost": f'avg by (term) (laps_engine_decode_cost_seconds{{{ns},pod=~"{deployment_pod_regex(cluster.decode)}"}})',
    }


def observation(results: Mapping[str, Samples], now: float, span_s: float | None = None) -> Reading:
    """The queries' answers -> Reading (pure); `span_s`: the seconds the rates were counted over."""
    arrivals = {s.get("class"): v for s, v in results["arrivals"] if s.get("class") in CLASSES}
    if not arrivals:
        return Reading(None, None, "MetricsMissing", "no laps_gateway_arrivals_total series: is Prometheus "
                                                     "scraping the gateway pods (monitoring.podMonitor)?")
    tokens = {(s.get("class"), s.get("kind")): v for s, v in results["tokens"]}
    waiting = {s.get("group"): v for s, v in results["waiting"]}
    classes = {}
    for cls in CLASSES:   # rates: what arrived in one second
        prompt = tokens.get((cls, "prompt"), 0.0)
        classes[cls] = ClassLoad.counted(arrivals.get(cls, 0.0), prompt, prompt, tokens.get((cls, "output"), 0.0),
                                         1.0, max(0.0, waiting.get(cls, 0.0)))
    running = sum(v for _, v in results["decode"]) if results["decode"] else None
    observed = Observation(now, classes, running, span_s)
    held = {s["pod"]: v for s, v in results["decode"] if s.get("pod")}
    cost = {s.get("term"): v for s, v in results["cost"]}
    overhead, per_token = cost.get("overhead", math.nan), cost.get("per_token", math.nan)
    if not (math.isfinite(overhead) and math.isfinite(per_token)):
        return Reading(observed, None, decode_held=held)
    step = {s.get("term"): v for s, v in results.get("decode_cost", ())}
    step_overhead, per_request = step.get("overhead", math.nan), step.get("per_request", math.nan)
    if not (math.isfinite(step_overhead) and math.isfinite(per_request)):   # not measured: sized by slots
        step_overhead = per_request = 0.0
    return Reading(observed, PodCosts(prefill_overhead_s=overhead, prefill_per_token_s=per_token,
                                      decode_overhead_s=step_overhead, decode_per_request_s=per_request,
                                      decode_per_context_token_s=0.0, decode_max_running=DEFAULT_DECODE_SLOTS,
                                      decode_kv_tokens=2**62), decode_held=held)


def instant(body: Any, status_code: int) -> Samples:
    """An instant query's answer -> [(labels, value)]; ValueError saying what is wrong."""
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else "the answer is not a JSON object"
        raise ValueError(f"HTTP {status_code}: {error or 'error'}")
    data = body.get("data") or {}
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise ValueError(f"HTTP {status_code}: not an instant vector: {data!r}"[:300])
    out = []
    for sample in data["result"]:
        try:
            out.append((dict(sample.get("metric") or {}), float(sample["value"][1])))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise ValueError(f"malformed sample: {sample!r}"[:300]) from None
    return out


def queued(url: str, cluster: ClusterRef, pods: list[str], *, timeout_s: float = TIMEOUT_S) -> float | None:
    """Requests waiting in the prefill queues of `pods` (laps_engine_queue_requests), None when
    Prometheus cannot say; pods without series (not made, or gone) hold none."""
    names = "|".join(p.replace(".", "\\\\.") for p in pods)
    query = f'sum(laps_engine_queue_requests{{namespace="{cluster.namespace}",pod=~"{names}"}})'
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            samples = _query(client, url, query)
    except (httpx.HTTPError, httpx.InvalidURL, UnicodeError, ValueError):
        return None
    return sum(v for _, v in samples)


def _query(client: httpx.Client, url: str, query: str) -> Samples:
    """One instant query; httpx's errors or ValueError (instant) when it cannot be answered."""
    response = client.get(url.rstrip("/") + "/api/v1/query", params={"query": query})
    return instant(response.json(), response.status_code)


def read(url: str, cluster: ClusterRef, window_s: float, now: float, *, timeout_s: float = TIMEOUT_S) -> Reading:
    results: dict[str, Samples] = {}
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        for name, query in queries(cluster, window_s).items():
            try:
                results[name] = _query(client, url, query)
            except (httpx.HTTPError, httpx.InvalidURL, UnicodeError) as exc:
                return Reading(None, None, "MetricsMissing", f"cannot query {url}: {type(exc).__name__}: {exc}"[:500])
            except ValueError as exc:
                return Reading(None, None, "MetricsMissing", f"Prometheus at {url}, {name}: {exc}"[:500])
    return observation(results, now, rate_window_s(window_s))
