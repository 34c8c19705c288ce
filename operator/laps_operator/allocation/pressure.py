"""Group pressure for the allocation loop: each class's offered prefill work per second (P_g).

P_g is what `laps local` and `laps sim` decide on (policy/allocation.py): the rate of the
gateways' `laps_gateway_offered_prefill_seconds_total{class}` (each arriving request's prefill
seconds at the prefill pods' measured cost), summed over the gateway replicas (each counts the
requests it received), from one of two sources:
* Prometheus (`spec.monitoring.prometheusURL`): one instant query per decision (`default_query`):
  the rate over the window. `spec.monitoring.pressureQuery` replaces it and must return an
  instant vector of one series per group, labelled group="short|long", in seconds of prefill
  work per second.
* Without Prometheus, the gateway pods' own /metrics, read every second; the caller's
  `GatewayWindow` takes the rate between the interval's first and last reading.
A doubtful reading is "unknown" with a reason, never a number (the source down or refusing, a
group missing, a stale result, a gateway pod unreadable), and unknown means no move (allocation
policy rule 1). The pure parts (parse_prometheus, parse_gateway_metrics, default_query) do no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from laps_agent.policy.allocation import OfferedRate
from laps_agent.policy.classes import CLASSES
from laps_operator.naming import ClusterRef, role_selector
from laps_operator.reconcile.kube import Kube, Ref
from laps_operator.status.pod_problems import pod_ready

OFFERED = "laps_gateway_offered_prefill_seconds"
# What Kubernetes writes a ReplicaSet's pod-template-hash and a generateName suffix in
# (k8s.io/apimachinery's rand.SafeEncodeString and rand.String): no vowels, no 0, 1 or 3.
GENERATED_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
TIMEOUT_S = 5.0
# A rate needs two scrapes in its window at least; 4 s holds two of a PodMonitor scraping every
# second (render.builders' scrape_interval_seconds), and the planner's rates use it alike.
MIN_WINDOW_S = 4.0


@dataclass(frozen=True)
class Reading:
    totals: Mapping[str, float] | None      # group -> P_g; None: unknown
    reason: str = ""                        # CamelCase cause when unknown (a condition's reason)
    message: str = ""                       # what a human needs to fix it
    source: str = "prometheus"              # "prometheus" | "gateways"

    @property
    def known(self) -> bool:
        return self.totals is not None


def unknown(reason: str, message: str, source: str = "prometheus") -> Reading:
    return Reading(None, reason, message, source)


def window_seconds(interval_s: float) -> float:
    """The rate's window: the interval, but at least MIN_WINDOW_S (two scrapes of the PodMonitor
    the operator renders: it scrapes every interval/2, at least every second)."""
    return max(float(interval_s), MIN_WINDOW_S)


def gateway_pod_regex(cluster: ClusterRef) -> str:
    """Names of the gateway Deployment's pods, `<deployment>-<template hash>-<suffix>`: anchored
    (PromQL regexes are), so cluster "a" never matches "a-gateway-b"'s pods. Kubernetes cuts
    `<deployment>-<hash>-` to 58 characters before it adds the 5-character suffix, so from a
    cluster name of 39 characters on the dash before the suffix is gone (`<deployment>-<hash
    cut><suffix>`): one segment or two after the Deployment's name. Both are written in the
    alphabet Kubernetes generates names in (GENERATED_NAME_CHARS), which has no vowel: with
    [a-z0-9] the pods of a cluster named `<this one>-gateway` (`<...>-gateway-gateway-<hash
    cut><suffix>`, once cut) matched too, and their pending work was counted as this one's."""
    return deployment_pod_regex(cluster.gateway)


def deployment_pod_regex(deployment: str) -> str:
    """The pods of Deployment `deployment`, as gateway_pod_regex says (the planner selects the
    decode pods with it)."""
    # Object names hold [a-z0-9.-]; a dot is the one regex character, escaped for the regex
    # (backslash) inside a PromQL string (which needs that backslash doubled).
    chars = f"[{GENERATED_NAME_CHARS}]+"
    return deployment.replace(".", "\\\\.") + f"-{chars}(-{chars})?"


def default_query(cluster: ClusterRef, window_s: float) -> str:
    """Every gateway replica of the cluster, selected by the `namespace` and `pod` labels that
    Kubernetes service discovery gives (the rendered PodMonitor, ServiceMonitors); the class
    label named `group`, as the groups are named after their classes."""
    selector = f'namespace="{cluster.namespace}",pod=~"{gateway_pod_regex(cluster)}"'
    window = f"[{int(round(window_s * 1000))}ms]"
    return (f'sum by (group) (label_replace(rate({OFFERED}_total{{{selector}}}{window}), '
            f'"group", "$1", "class", "(.*)"))')


def parse_prometheus(status_code: int, body: Any, now: float, max_age_s: float) -> Reading:
    """An instant query's answer -> Reading (pure)."""
    if not isinstance(body, dict):
        return unknown("PrometheusError", f"HTTP {status_code}: the answer is not a JSON object")
    if body.get("status") != "success":
        return unknown("PrometheusError", f"HTTP {status_code}: {body.get('errorType') or 'error'}: "
                                          f"{body.get('error') or 'no error message'}")
    data = body.get("data") or {}
    if not isinstance(data, dict):
        # The URL answers JSON but is not Prometheus' query API (another service, a proxy's page):
        # say so in the condition instead of failing the loop on every interval.
        return unknown("PrometheusError", f"HTTP {status_code}: `data` is not a query result: {data!r}"[:500])
    if data.get("resultType") != "vector":
        return unknown("BadQuery", f"the pressure query must return an instant vector, got {data.get('resultType')!r}")
    result = data.get("result") or []
    if not isinstance(result, list) or not all(isinstance(s, dict) and isinstance(s.get("metric") or {}, dict)
                                               for s in result):
        return unknown("PrometheusError", f"HTTP {status_code}: `data.result` is not a list of samples: {result!r}"[:500])
    totals: dict[str, float] = {}
    for sample in result:
        group = (sample.get("metric") or {}).get("group")
        if group not in CLASSES:
            continue
        try:
            stamp, value = float(sample["value"][0]), float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            return unknown("PrometheusError", f"malformed sample for group {group}: {sample!r}")
        if now - stamp > max_age_s:
            return unknown("Stale", f"the {group} sample is {now - stamp:.0f}s old (more than {max_age_s:g}s)")
        if math.isnan(value) or math.isinf(value):
            return unknown("NoSeries", f"group {group} has no number ({value})")
        totals[group] = totals.get(group, 0.0) + value
    if not totals:
        return unknown("NoSeries", "the pressure query returned no series with a group label "
                                   "(is Prometheus scraping the gateway, at least twice per interval?)")
    missing = [g for g in CLASSES if g not in totals]
    if missing:
        return unknown("GroupMissing", f"no pressure series for group {', '.join(missing)}")
    return Reading(totals)


def query_prometheus(url: str, query: str, now: float, max_age_s: float, *,
                     timeout_s: float = TIMEOUT_S) -> Reading:
    try:
        response = httpx.get(url.rstrip("/") + "/api/v1/query", params={"query": query},
                             timeout=timeout_s, trust_env=False)
    # InvalidURL is no HTTPError; UnicodeError is a host the resolver cannot be asked for (the
    # spec's check refuses those: this keeps any it misses a condition, not a traceback a tick).
    except (httpx.HTTPError, httpx.InvalidURL, UnicodeError) as exc:
        return unknown("PrometheusUnreachable", f"cannot query {url}: {type(exc).__name__}: {exc}"[:500])
    try:
        body = response.json()
    except ValueError:
        return unknown("PrometheusError", f"HTTP {response.status_code} from {url}: {response.text[:200]!r}")
    return parse_prometheus(response.status_code, body, now, max_age_s)


def parse_gateway_metrics(text: str) -> dict[str, float]:
    """One gateway's /metrics -> its offered prefill seconds so far per class (pure); ValueError
    when the series or one of its classes is missing or the text is not the exposition format."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            cls = sample.labels.get("class")
            if sample.name == f"{OFFERED}_total" and cls in CLASSES:
                found[cls] = found.get(cls, 0.0) + float(sample.value)
    missing = [g for g in CLASSES if g not in found]
    if missing:
        raise ValueError(f"no {OFFERED}_total for class {', '.join(missing)}")
    return found


def _gateway_port(pod: dict[str, Any], default: int) -> int:
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == "http" and port.get("containerPort"):
                return int(port["containerPort"])
    return default


def scrape_gateways(kube: Kube, cluster: ClusterRef, port: int, *, timeout_s: float = 2.0) -> Reading:
    """One reading: the Ready gateway pods' offered prefill seconds so far, summed over the pods.
    Ready ones only:
    the gateway Service sends work to those alone, and a pod Running but not Ready (starting,
    or crash-looping: its phase stays Running) cannot be read, which made every reading unknown
    and stopped the allocation loop for as long as one replica was down."""
    pods = kube.list(Ref("v1", "Pod", cluster.namespace), role_selector(cluster.name, "gateway"))
    pods = [p for p in pods if (p.get("status") or {}).get("podIP") and pod_ready(p)
            and not p["metadata"].get("deletionTimestamp")]
    if not pods:
        return unknown("NoGateway", "no Ready gateway pod to read pressure from", "gateways")
    totals = dict.fromkeys(CLASSES, 0.0)
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        for pod in pods:
            url = f"http://{pod['status']['podIP']}:{_gateway_port(pod, port)}/metrics"
            try:
                response = client.get(url)
                response.raise_for_status()
                per_group = parse_gateway_metrics(response.text)
            except (httpx.HTTPError, ValueError) as exc:
                return unknown("GatewayUnreachable",
                               f"gateway pod {pod['metadata']['name']} ({url}): {exc}"[:500], "gateways")
            for group, value in per_group.items():
                totals[group] += value
    return Reading(totals, source="gateways")


class GatewayWindow:
    """Readings between two decisions (fallback mode): the rate from the window's start (the
    previous decision's last reading, or the first one after a failure) to its last reading
    (OfferedRate), or unknown if any one failed (a gateway missing from one reading would bias
    it)."""

    def __init__(self) -> None:
        self._rate = OfferedRate()
        self._latest: tuple[float, Mapping[str, float]] | None = None
        self._failure: Reading | None = None

    def add(self, now: float, reading: Reading) -> None:
        if not reading.known:
            self._failure = self._failure or reading
        elif not self._rate.started:
            self._rate.take(now, reading.totals)
        else:
            self._latest = (now, reading.totals)

    @property
    def ready(self) -> bool:
        """Whether `take` has a rate or a failure to give (a window just started has neither yet)."""
        return self._failure is not None or self._latest is not None

    def take(self) -> Reading:
        failure, latest = self._failure, self._latest
        self._failure, self._latest = None, None
        if failure is not None:
            self._rate = OfferedRate()   # the next rate starts from the next good reading
            return failure
        if latest is None:
            return unknown("NoSamples", "fewer than two gateway readings in this interval: no rate yet", "gateways")
        return Reading(self._rate.take(*latest), source="gateways")
