"""Watches through the official client's `watch.Watch().stream(...)`, as the gateway uses them."""
from __future__ import annotations

import queue
import threading
import time

import kubernetes
import pytest
from kubernetes import watch

_DEADLINE_S = 20.0
SVC_LABEL = "kubernetes.io/service-name"


@pytest.fixture
def discovery(kube_api):
    return kubernetes.client.DiscoveryV1Api(kube_api.api_client())


def _slice(name: str, service: str, ip: str = "10.0.0.1") -> dict:
    return {"metadata": {"name": name, "labels": {SVC_LABEL: service}}, "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
            "ports": [{"name": "http", "port": 30000, "protocol": "TCP"}]}


class WatchInThread:
    """Consumes a watch stream in a thread so the test can act meanwhile."""

    def __init__(self, func, *args, **kwargs) -> None:
        self.events: queue.Queue = queue.Queue()
        self.watch = watch.Watch()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(func, args, kwargs), daemon=True)
        self.thread.start()

    def _run(self, func, args, kwargs) -> None:
        try:
            for event in self.watch.stream(func, *args, **kwargs):
                self.events.put((event["type"], event["object"]))
        except BaseException as exc:  # surfaced by next()
            self.error = exc
        finally:
            self.events.put(None)

    def next(self) -> tuple[str, object]:
        item = self.events.get(timeout=_DEADLINE_S)
        if item is None:
            raise AssertionError(f"the watch ended early: {self.error!r}")
        return item

    def stop(self) -> None:
        self.watch.stop()


def test_namespaced_watch_with_label_selector_delivers_live_events(discovery):
    discovery.create_namespaced_endpoint_slice("serving", _slice("decode-a", "c1-decode"))
    watcher = WatchInThread(discovery.list_namespaced_endpoint_slice, "serving",
                            label_selector=f"{SVC_LABEL}=c1-decode", timeout_seconds=60)
    kind, obj = watcher.next()
    assert (kind, obj.metadata.name) == ("ADDED", "decode-a")   # the current state first

    discovery.create_namespaced_endpoint_slice("serving", _slice("other", "c1-prefill"))
    discovery.create_namespaced_endpoint_slice("elsewhere", _slice("decode-x", "c1-decode"))
    discovery.create_namespaced_endpoint_slice("serving", _slice("decode-b", "c1-decode", "10.0.0.2"))
    kind, obj = watcher.next()
    assert (kind, obj.metadata.name) == ("ADDED", "decode-b")
    assert obj.endpoints[0].addresses == ["10.0.0.2"] and obj.ports[0].name == "http"

    discovery.patch_namespaced_endpoint_slice("decode-b", "serving", {
        "endpoints": [{"addresses": ["10.0.0.3"], "conditions": {"ready": False}}]})
    kind, obj = watcher.next()
    assert kind == "MODIFIED" and obj.endpoints[0].addresses == ["10.0.0.3"]
    assert obj.endpoints[0].conditions.ready is False

    discovery.delete_namespaced_endpoint_slice("decode-a", "serving")
    kind, obj = watcher.next()
    assert (kind, obj.metadata.name) == ("DELETED", "decode-a")
    watcher.stop()


def test_objects_moving_across_the_selector_are_added_and_deleted(discovery):
    watcher = WatchInThread(discovery.list_namespaced_endpoint_slice, "serving",
                            label_selector=f"{SVC_LABEL}=c1-decode", timeout_seconds=60)
    discovery.create_namespaced_endpoint_slice("serving", _slice("s", "c1-decode"))
    assert watcher.next()[0] == "ADDED"
    discovery.patch_namespaced_endpoint_slice("s", "serving", {"metadata": {"labels": {SVC_LABEL: "moved"}}})
    assert watcher.next()[0] == "DELETED"
    discovery.patch_namespaced_endpoint_slice("s", "serving", {"metadata": {"labels": {SVC_LABEL: "c1-decode"}}})
    assert watcher.next()[0] == "ADDED"
    watcher.stop()


def test_timeout_seconds_ends_the_stream(discovery):
    discovery.create_namespaced_endpoint_slice("serving", _slice("s", "svc"))
    events = list(watch.Watch().stream(discovery.list_namespaced_endpoint_slice, "serving",
                                       timeout_seconds=1))
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "s")]


def test_watch_from_a_resource_version_replays_only_later_changes(discovery):
    discovery.create_namespaced_endpoint_slice("serving", _slice("old", "svc"))
    since = discovery.list_namespaced_endpoint_slice("serving").metadata.resource_version
    discovery.create_namespaced_endpoint_slice("serving", _slice("new", "svc"))
    discovery.delete_namespaced_endpoint_slice("old", "serving")
    events = list(watch.Watch().stream(discovery.list_namespaced_endpoint_slice, "serving",
                                       resource_version=since, timeout_seconds=1))
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "new"), ("DELETED", "old")]


def test_cluster_wide_watch_sees_all_namespaces(kube_api):
    core = kubernetes.client.CoreV1Api(kube_api.api_client())
    watcher = WatchInThread(core.list_config_map_for_all_namespaces, timeout_seconds=60)
    for namespace in ("a", "b"):
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "c"}})
    seen = {watcher.next()[1].metadata.namespace for _ in range(2)}
    assert seen == {"a", "b"}
    watcher.stop()


def test_watch_streams_json_lines(kube_api, discovery):
    discovery.create_namespaced_endpoint_slice("serving", _slice("s", "svc"))
    url = f"{kube_api.url}/apis/discovery.k8s.io/v1/namespaces/serving/endpointslices"
    with kube_api.http.stream("GET", url, params={"watch": "true", "timeoutSeconds": "1"}) as response:
        assert response.headers["content-type"].startswith("application/json")
        lines = [line for line in response.iter_lines() if line]
    assert len(lines) == 1 and '"type": "ADDED"' in lines[0]


def test_an_abandoned_watch_is_cleaned_up(kube_api):
    url = f"{kube_api.url}/api/v1/namespaces/default/configmaps"
    with kube_api.http.stream("GET", url, params={"watch": "true"}) as response:
        assert response.status_code == 200
    resource = kube_api.emulator.resource("", "v1", "configmaps")
    deadline = time.monotonic() + _DEADLINE_S
    while kube_api.call(lambda: len(kube_api.emulator.store.watchers[resource])) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling interval; the condition decides
    assert kube_api.call(lambda: len(kube_api.emulator.store.watchers[resource])) == 0


def test_watch_on_one_object_url_sees_only_that_object(kube_api):
    core = kubernetes.client.CoreV1Api(kube_api.api_client())
    for name in ("mine", "other"):
        core.create_namespaced_config_map("default", {"metadata": {"name": name}})
    url = f"{kube_api.url}/api/v1/namespaces/default/configmaps/mine"
    with kube_api.http.stream("GET", url, params={"watch": "true", "timeoutSeconds": "1"}) as response:
        lines = [line for line in response.iter_lines() if line]
    assert len(lines) == 1 and '"name": "mine"' in lines[0]


def test_a_watch_from_before_compaction_gets_410_expired(kube_api, discovery):
    discovery.create_namespaced_endpoint_slice("serving", _slice("s", "svc"))
    since = discovery.list_namespaced_endpoint_slice("serving").metadata.resource_version
    discovery.create_namespaced_endpoint_slice("serving", _slice("t", "svc"))
    kube_api.compact()
    with pytest.raises(kubernetes.client.ApiException) as err:
        list(watch.Watch().stream(discovery.list_namespaced_endpoint_slice, "serving",
                                  resource_version=since, timeout_seconds=1))
    assert err.value.status == 410
    # A fresh list gives a resourceVersion to watch from again.
    fresh = discovery.list_namespaced_endpoint_slice("serving").metadata.resource_version
    assert list(watch.Watch().stream(discovery.list_namespaced_endpoint_slice, "serving",
                                     resource_version=fresh, timeout_seconds=1)) == []
