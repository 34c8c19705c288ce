"""Membership from the EndpointSlices of the `-prefill-short`, `-prefill-long` and decode
Services, kept current by one watch.

The official client is synchronous, so a thread lists the slices, then watches from the list's
resourceVersion (resuming from the last one seen when a watch times out, re-listing on 410
Gone) and swaps in a new immutable `Membership` after every event; the asyncio side only reads
that reference, so a relabel takes effect as soon as its watch event arrives. Only endpoints
whose `conditions.ready` is not false count, addressed by their ports named `http` and
`bootstrap`, and named by their `targetRef` (the pod)."""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from laps_agent.gateway.discovery import Discovery, Membership
from laps_agent.gateway.routing import Endpoint

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
        host = f"[{address}]" if ":" in address else address
        name = (ep.get("targetRef") or {}).get("name") or address
        found.append(Endpoint(name=name, url=f"http://{host}:{http_port}",
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
    return Membership(groups={"short": ordered[services.prefill_short],
                              "long": ordered[services.prefill_long]},
                      decode=ordered[services.decode])


class KubernetesDiscovery(Discovery):
    def __init__(self, services: ServiceNames, *, namespace: str | None = None, api_client=None,
                 watch_timeout_s: int = 300, retry_s: float = 1.0) -> None:
        self._services, self._namespace = services, namespace or own_namespace()
        self._api_client, self._watch_timeout_s, self._retry_s = api_client, watch_timeout_s, retry_s
        self._membership = Membership()
        self._slices: dict[str, dict] = {}
        self._stop = threading.Event()
        self._watch = None
        self._thread: threading.Thread | None = None

    def membership(self) -> Membership:
        return self._membership

    async def start(self) -> None:
        if self._api_client is None:
            self._api_client = _default_api_client()
        self._thread = threading.Thread(target=self._run, name="endpointslice-watch", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()  # unblocks a read in progress
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)

    def _selector(self) -> str:
        s = self._services
        return f"{SERVICE_LABEL} in ({s.prefill_short},{s.prefill_long},{s.decode})"

    def _run(self) -> None:
        import kubernetes

        api = kubernetes.client.DiscoveryV1Api(self._api_client)
        resource_version = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list(api)
                resource_version = self._watch_from(api, resource_version)
            except kubernetes.client.ApiException as exc:
                if exc.status == 410:  # our resourceVersion is too old: start over from a list
                    log.info("EndpointSlice watch expired; re-listing")
                else:
                    log.warning("EndpointSlice watch failed (%s); retrying", exc.status)
                    self._stop.wait(self._retry_s)
                resource_version = None
            except Exception as exc:  # API unreachable and the like: keep the last membership
                if self._stop.is_set():
                    break
                log.warning("EndpointSlice watch error: %r; retrying", exc)
                self._stop.wait(self._retry_s)
                resource_version = None

    def _list(self, api) -> str:
        import json

        response = api.list_namespaced_endpoint_slice(
            self._namespace, label_selector=self._selector(), _preload_content=False)
        listing = json.loads(response.data)
        self._slices = {item["metadata"]["name"]: item for item in listing.get("items") or ()}
        self._publish()
        return listing["metadata"]["resourceVersion"]

    def _watch_from(self, api, resource_version: str) -> str:
        import kubernetes

        self._watch = watch = kubernetes.watch.Watch()
        for event in watch.stream(api.list_namespaced_endpoint_slice, self._namespace,
                                  label_selector=self._selector(), resource_version=resource_version,
                                  timeout_seconds=self._watch_timeout_s, allow_watch_bookmarks=True):
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
            log.info("membership: short=%s long=%s decode=%s",
                     *([e.name for e in membership.groups[g]] for g in ("short", "long")),
                     [e.name for e in membership.decode])
        self._membership = membership


def _default_api_client():
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()
