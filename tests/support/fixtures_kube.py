"""`kube_api`: a Kubernetes API server (tests/support/kube_emulator.py) on 127.0.0.1 for a test.

Usage (sync or async tests alike; the server runs in its own thread and event loop)::

    def test_something(kube_api):
        kube_api.apply_crd("charts/laps/crds/lapscluster.yaml")  # the CR kind becomes servable
        core = kubernetes.client.CoreV1Api(kube_api.api_client())
        core.create_namespaced_config_map("default", {"metadata": {"name": "c"}})
        # subprocesses (`kopf run --standalone ...`, `laps operator`, `laps gateway`) find the
        # server through $KUBECONFIG, set for the test; or pass kube_api.kubeconfig explicitly.
        kube_api.find("v1/configmaps", "default", "c")        # the stored dict, or None

- `.url`, `.kubeconfig` (a file in tmp_path; $KUBECONFIG and the `kubernetes` client's default
  location point at it during the test; $KUBECACHEDIR is a temp dir).
- In-process code that calls `kubernetes.config.load_kube_config()` with no arguments gets
  this server too (the client's default Configuration is restored afterwards).
- `.http`: an `httpx.Client` for raw requests. Every request is the admin's: RBAC, tokens and
  admission are the real control plane's to show (tests/cluster).
- `.api_client()`: a configured `kubernetes.client.ApiClient` (closed at teardown).
- `.apply_crd(path)`: creates (or replaces) the CRDs of a YAML file through the API.
- `.find(resource, namespace, name)`: a stored object; resource like "apps/v1/statefulsets".
- `.history(resource, namespace, name)`: every stored version of it, oldest first.
- `.emulate_endpoint_slices()`: opt in to an EndpointSlice controller (Services + pods with
  status.podIP and a Ready condition -> slices labelled kubernetes.io/service-name).
- `.emulator`: the `KubeEmulator`; `.emulator.requests` is the request log (KMock Requests:
  .method, .url, .params, .data, .resource, .namespace, .name),
  `.objects[...]` the per-object history, and KMock reactions inject failures, e.g.
  `kube_api.emulator["patch", kmock.resource("laps.io/v1/lapsclusters")][:1] << 409` (served
  instead of the emulator, once; nothing is stored).
- `.compact()`: forget the change history, so resuming watches get 410 Expired.
- Helm 4 works against it: `helm_python.Config(kubeconfig_path=str(kube_api.kubeconfig),
  storage_driver="memory")` then install/upgrade/uninstall (see test_helm.py).
- `.call(fn)`: run fn on the server's event loop (consistent reads of `.emulator` state).

Custom objects are pruned, defaulted and validated (422) against their CRD's schema as on a
real server: a status field the CRD does not declare silently disappears. Status is written
only through `/status` for kinds that have that subresource (create ignores it).
Namespaces `default` and `kube-system` exist; other names need not be created first. No
controllers run (a StatefulSet makes no pods: tests create the pods and set their status via
`patch_namespaced_pod_status`); see kube_emulator.py for what is and is not emulated.
A test stops the processes it starts; at teardown the server ends open watches, then stops.
"""
from __future__ import annotations

import asyncio
import copy
import pathlib
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kmock
import pytest
import yaml

from tests.support.kube_emulator import KubeEmulator

T = TypeVar("T")
_START_TIMEOUT_S = 30.0
ADMIN_TOKEN = "emulator-token"   # sent, never checked: the emulator authenticates nobody


class _ServingThread(threading.Thread):
    """Runs the emulator and its HTTP server in an event loop of its own, so that blocking
    clients (the `kubernetes` client, subprocess waits) and async tests can all use it."""

    def __init__(self) -> None:
        super().__init__(name="kube-emulator", daemon=True)
        self.ready = threading.Event()
        self.emulator: KubeEmulator | None = None
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.failure: BaseException | None = None
        self.internal_errors: list[Exception] = []
        self._stop_requested: asyncio.Event | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the fixture, which fails the test
            self.failure = exc
            self.ready.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        emulator = KubeEmulator()
        with warnings.catch_warnings():  # kmock reads its bundle with a deprecated API
            warnings.simplefilter("ignore", DeprecationWarning)
            emulator.resources.load_bundled()
        async with emulator, kmock.Server(emulator, host="127.0.0.1") as server:
            for namespace in ("default", "kube-system"):
                emulator.store.create(kmock.resource("", "v1", "namespaces"), None,
                                      {"metadata": {"name": namespace}})
            self.emulator, self.url = emulator, f"http://127.0.0.1:{server.port}"
            self.ready.set()
            await self._stop_requested.wait()
            emulator.close_watches()
            # 500s from the emulator itself are its bugs, not the test's: worth reporting.
            self.internal_errors = [e for e in emulator.errors
                                    if not isinstance(e, kmock.KubernetesError)]

    def stop(self) -> None:
        if self.loop is not None and self._stop_requested is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._stop_requested.set)
        self.join(timeout=30)


def _plain(value: Any) -> Any:
    """KMock's stored versions as plain dicts and lists (JSON-serialisable copies)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


def _kubeconfig_text(url: str, token: str = ADMIN_TOKEN) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "emulator", "user": {"token": token}}],
        "contexts": [{"name": "emulator",
                      "context": {"cluster": "emulator", "user": "emulator", "namespace": "default"}}],
    })


@dataclass
class KubeApi:
    url: str
    kubeconfig: pathlib.Path
    emulator: KubeEmulator
    _thread: _ServingThread
    _clients: list[Any] = field(default_factory=list)
    admin_headers: dict[str, str] = field(default_factory=lambda: {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    _http: Any = None

    @property
    def http(self) -> Any:
        import httpx

        if self._http is None:
            self._http = httpx.Client(base_url=self.url, headers=self.admin_headers, timeout=30)
        return self._http

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` for this server (closed at teardown)."""
        import kubernetes

        client = kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))
        self._clients.append(client)
        return client

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server's event loop (for reads/writes consistent with requests)."""
        async def run() -> T:
            return fn()
        future = asyncio.run_coroutine_threadsafe(run(), self._thread.loop)
        return future.result(timeout=30)

    def find(self, resource: str, namespace: str | None, name: str) -> dict | None:
        """The stored object (e.g. `find("apps/v1/statefulsets", "ns", "x")`), or None."""
        ref = kmock.resource(resource)
        return self.call(lambda: self.emulator.store.find(ref, namespace, name))

    def history(self, resource: str, namespace: str | None, name: str) -> list[dict]:
        """Every stored version of an object, oldest first (deletions left out): what a test
        asserts on when no intermediate state may ever have been written (e.g. a revert)."""
        ref = kmock.resource(resource)

        def read() -> list[dict]:
            key = (ref, namespace, name)
            if key not in self.emulator.store.objects:
                return []
            return [_plain(v) for v in self.emulator.store.objects[key].history.raw if v is not None]
        return self.call(read)

    def emulate_endpoint_slices(self) -> None:
        """Opt in to an EndpointSlice controller: from now on, every Service with a selector
        has a slice listing the selected pods that have a status.podIP (see
        kube_emulator_endpoints.py). Tests still set pod IPs and Ready conditions."""
        from tests.support.kube_emulator_endpoints import EndpointSliceController

        self.call(lambda: EndpointSliceController(self.emulator.store).reconcile())

    def compact(self) -> int:
        """Compact the history (as etcd does): watches resuming from an older resourceVersion
        get 410 Expired and must list again. Returns the compacted revision."""
        return self.call(self.emulator.store.compact)

    def apply_crd(self, path: str | pathlib.Path) -> list[str]:
        """Create (or replace) the CRDs in a YAML file through the API, as `kubectl apply -f`
        does, so their resources become servable. Returns the CRD names."""
        import kubernetes

        api = kubernetes.client.ApiextensionsV1Api(self.api_client())
        names = []
        for doc in yaml.safe_load_all(pathlib.Path(path).read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            name = doc["metadata"]["name"]
            try:
                api.create_custom_resource_definition(body=doc)
            except kubernetes.client.ApiException as exc:
                if exc.status != 409:
                    raise
                current = api.read_custom_resource_definition(name)
                doc["metadata"]["resourceVersion"] = current.metadata.resource_version
                api.replace_custom_resource_definition(name, body=doc)
            names.append(name)
        return names

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        for client in self._clients:
            try:
                client.close()
            except Exception:  # a client of a stopped server may fail to close its pool
                pass


@pytest.fixture
def kube_api(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApi]:
    import kubernetes.client
    import kubernetes.config.kube_config as kube_config

    thread = _ServingThread()
    thread.start()
    try:
        if not thread.ready.wait(_START_TIMEOUT_S) or thread.emulator is None:
            raise RuntimeError(f"the Kubernetes emulator did not start: {thread.failure!r}")
        kubeconfig = tmp_path / "kubeconfig.yaml"
        kubeconfig.write_text(_kubeconfig_text(thread.url))
        cache_dir = tmp_path / "kube-cache"
        cache_dir.mkdir()
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv("KUBECACHEDIR", str(cache_dir))
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        # load_kube_config() in the test's process sets the client's global default
        # Configuration; put the previous one back so no later test talks to a dead server.
        monkeypatch.setattr(kubernetes.client.Configuration, "_default",
                            kubernetes.client.Configuration._default)
        api = KubeApi(url=thread.url, kubeconfig=kubeconfig, emulator=thread.emulator, _thread=thread)
        try:
            yield api
        finally:
            api.close()
    finally:
        thread.stop()
    if thread.is_alive():
        raise RuntimeError("the Kubernetes emulator did not stop within 30 s")
    for error in thread.internal_errors:
        warnings.warn(f"the Kubernetes emulator answered 500 (an emulator bug?): {error!r}",
                      stacklevel=1)


# Clients of whichever `kube_api` the test has: the emulator's, or tests/cluster's real one.
@pytest.fixture
def core(kube_api):
    import kubernetes

    return kubernetes.client.CoreV1Api(kube_api.api_client())


@pytest.fixture
def apps(kube_api):
    import kubernetes

    return kubernetes.client.AppsV1Api(kube_api.api_client())
