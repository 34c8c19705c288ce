"""Membership from the EndpointSlices of the `-prefill-short`, `-prefill-long` and decode
Services, kept current by one watch.

The official client is synchronous, so a thread lists the slices, then watches from the list's
resourceVersion (resuming from the last one seen when a watch times out, re-listing on 410
Gone) and swaps in a new immutable `Membership` after every event; the asyncio side only reads
that reference, so a relabel takes effect as soon as its watch event arrives. Every request
has a read timeout: a watch silent for longer than the server's own timeoutSeconds (plus some
slack) is a dead connection (half-open TCP, a stuck proxy) and is replaced by a fresh list and
watch, rather than leaving the gateway deaf to changes. Only endpoints
whose `conditions.ready` is not false count, addressed by their ports named `http` and
`bootstrap`, and named by their `targetRef` (the pod)."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from laps_agent.gateway.discovery.membership import Discovery, Membership
from laps_agent.policy.classes import CLASSES, LONG, SHORT
from laps_agent.policy.routing import Endpoint
from laps_agent.serving.listen import url_host

log = logging.getLogger(__name__)
SERVICE_LABEL = "kubernetes.io/service-name"
_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class ServiceNames:
    prefill_short: str
    prefill_long: str
    decode: str


def own_namespace() -> str:
    try:
        return _NAMESPACE_FILE.read_text().strip()
    except OSError:
        return "default"


def slice_endpoints(endpoint_slice: dict) -> list[Endpoint]:
    """The ready endpoints of one EndpointSlice (a plain dict as the API serves it)."""
    ports = {p.get("name"): p.get("port") for p in endpoint_slice.get("ports") or ()}
    http_port = ports.get("http")
    if http_port is None:
        return []
    bootstrap_port = ports.get("bootstrap")
    found = []
    for ep in endpoint_slice.get("endpoints") or ():
        if (ep.get("conditions") or {}).get("ready") is False:  # unset means ready
            continue
        addresses = ep.get("addresses") or ()
        if not addresses:
            continue
        address = addresses[0]  # all addresses of one endpoint are the same pod
        name = (ep.get("targetRef") or {}).get("name") or address
        found.append(Endpoint(name=name, url=f"http://{url_host(address)}:{http_port}",
                              bootstrap_host=address, bootstrap_port=bootstrap_port))
    return found


def membership_from_slices(slices: Iterable[dict], services: ServiceNames) -> Membership:
    by_service: dict[str, dict[str, Endpoint]] = {
        services.prefill_short: {}, services.prefill_long: {}, services.decode: {}}
    for endpoint_slice in slices:
        service = ((endpoint_slice.get("metadata") or {}).get("labels") or {}).get(SERVICE_LABEL)
        if service in by_service:
            for endpoint in slice_endpoints(endpoint_slice):
                by_service[service][endpoint.name] = endpoint
    ordered = {s: tuple(sorted(eps.values(), key=lambda e: e.name)) for s, eps in by_service.items()}
    return Membership(groups={SHORT: ordered[services.prefill_short],
                              LONG: ordered[services.prefill_long]},
                      decode=ordered[services.decode])


class KubernetesDiscovery(Discovery):
    def __init__(self, services: ServiceNames, *, namespace: str | None = None, api_client=None,
                 watch_timeout_s: int = 300, retry_s: float = 1.0, max_retry_s: float = 30.0,
                 read_slack_s: float = 30.0, connect_timeout_s: float = 10.0,
                 list_timeout_s: float = 30.0) -> None:
        self._services, self._namespace = services, namespace or own_namespace()
        self._api_client, self._watch_timeout_s = api_client, watch_timeout_s
        self._retry_s, self._max_retry_s = retry_s, max_retry_s
        # (connect, read) timeouts: a watch may be silent until the server ends it at
        # timeoutSeconds; silence beyond that plus the slack means the connection is dead.
        self._watch_request_timeout = (connect_timeout_s, watch_timeout_s + read_slack_s)
        self._list_request_timeout = (connect_timeout_s, list_timeout_s)
        self._membership = Membership()
        self._slices: dict[str, dict] = {}
        self._stop = threading.Event()
        self._watch = None
        self._client = None  # ours, made by start() from api_client (or the kubeconfig)
        self._thread: threading.Thread | None = None

    def membership(self) -> Membership:
        return self._membership

    async def start(self) -> None:
        self._client = _client_without_read_retries(self._api_client or _default_api_client())
        self._thread = threading.Thread(target=self._run, name="endpointslice-watch", daemon=True)
        self._thread.start()

    async def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._join_thread, timeout_s)
        if self._client is not None:
            self._client.close()

    def _join_thread(self, timeout_s: float) -> None:
        # Watch.stop() shuts the socket of a watch already answered (unblocking its read), but a
        # watch still waiting for its response forgets the request (Watch.stream resets its flag
        # when it starts): so ask again until the thread has gone.
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and time.monotonic() < deadline:
            watch = self._watch
            if watch is not None:
                watch.stop()
            self._thread.join(0.05)
        if self._thread.is_alive():
            log.warning("the EndpointSlice watch thread did not stop within %.0f s", timeout_s)

    def _selector(self) -> str:
        s = self._services
        return f"{SERVICE_LABEL} in ({s.prefill_short},{s.prefill_long},{s.decode})"

    def _run(self) -> None:
        import kubernetes

        api = kubernetes.client.DiscoveryV1Api(self._client)
        resource_version = None
        failures = 0  # in a row; the wait doubles with each, so a broken API is not hammered
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list(api)
                    failures = 0
                resource_version = self._watch_from(api, resource_version)
                continue
            except kubernetes.client.ApiException as exc:
                resource_version = None
                if exc.status == 410:  # our resourceVersion is too old: start over from a list
                    log.info("EndpointSlice watch expired; re-listing")
                    continue
                problem = f"{exc.status} {exc.reason}"
            except Exception as exc:  # API unreachable and the like: keep the last membership
                if self._stop.is_set():
                    break
                resource_version, problem = None, repr(exc)
            failures += 1
            wait_s = min(self._retry_s * 2 ** (failures - 1), self._max_retry_s)
            log.warning("EndpointSlice list/watch failed (%s); keeping the last membership, "
                        "retrying in %.1f s", problem, wait_s)
            self._stop.wait(wait_s)

    def _list(self, api) -> str:
        import json

        response = api.list_namespaced_endpoint_slice(
            self._namespace, label_selector=self._selector(), _preload_content=False,
            _request_timeout=self._list_request_timeout)
        listing = json.loads(response.data)
        self._slices = {item["metadata"]["name"]: item for item in listing.get("items") or ()}
        self._publish()
        return listing["metadata"]["resourceVersion"]

    def _watch_from(self, api, resource_version: str) -> str:
        import kubernetes

        self._watch = watch = kubernetes.watch.Watch()
        if self._stop.is_set():  # stop() came during the list: no new watch to wait out
            return resource_version
        for event in watch.stream(api.list_namespaced_endpoint_slice, self._namespace,
                                  label_selector=self._selector(), resource_version=resource_version,
                                  timeout_seconds=self._watch_timeout_s, allow_watch_bookmarks=True,
                                  _request_timeout=self._watch_request_timeout):
            obj = event["raw_object"]
            resource_version = obj["metadata"].get("resourceVersion", resource_version)
            kind = event["type"]
            if kind in ("ADDED", "MODIFIED"):
                self._slices[obj["metadata"]["name"]] = obj
            elif kind == "DELETED":
                self._slices.pop(obj["metadata"]["name"], None)
            else:
                continue  # BOOKMARK: only the resourceVersion moves on
            self._publish()
            if self._stop.is_set():
                break
        return resource_version

    def _publish(self) -> None:
        membership = membership_from_slices(self._slices.values(), self._services)
        if membership != self._membership:
            # No ready pod in a role is an outage (every request a 503 no_endpoint, logged per
            # request at debug only: proxy.py): a warning, once per change.
            empty = [role for role, pods in (("prefill", [e for g in CLASSES for e in membership.groups[g]]),
                                             ("decode", membership.decode)) if not pods]
            log.log(logging.WARNING if empty else logging.INFO, "membership: short=%s long=%s decode=%s%s",
                    *([e.name for e in membership.groups[g]] for g in CLASSES),
                    [e.name for e in membership.decode],
                    f" (no ready {' or '.join(empty)} pod: requests get 503)" if empty else "")
        self._membership = membership


def _client_without_read_retries(template):
    """A client of our own on `template`'s configuration with urllib3's read retries off: a watch
    read that timed out means a dead connection, which the watch loop answers by listing again
    at once; urllib3 would silently re-send the watch three times first (4x the timeout)."""
    import copy

    import kubernetes
    import urllib3

    configuration = copy.deepcopy(template.configuration)
    configuration.retries = urllib3.Retry(total=3, read=0, redirect=0)
    return kubernetes.client.ApiClient(configuration)


def _default_api_client():
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()
