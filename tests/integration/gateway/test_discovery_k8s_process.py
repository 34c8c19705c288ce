"""Kubernetes discovery when the API server is less kind: the watch's resourceVersion expires
(410 Gone) or the watch stops answering while the slices change, and the real
`laps gateway --discovery kubernetes` process, against the API emulator, in front of stub PD
engines, following a prefill pod that the operator moves from the short to the long group."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading

import httpx
import kmock
import kubernetes

from laps_agent.gateway.discovery.kubernetes import KubernetesDiscovery, ServiceNames
from laps_agent.policy.classes import CLASSES
from laps_operator.naming import GROUP_LABEL
from tests.support.fixtures_gateway import poll
from tests.support.fixtures_gateway_k8s import create_operator_services, start_pod, stub_pod, sync_endpoint_slices
from tests.support.stub_engine import KVHandoff

NS = "default"
SERVICES = ServiceNames("c-prefill-short", "c-prefill-long", "c-decode")
SLICES = kmock.resource("discovery.k8s.io", "v1", "endpointslices")
def long_prompt(n: int) -> str:
    """Far over the 64-token threshold used below; each `n` its own text (a repeated prompt would
    follow cache affinity to the pod that prefilled it before)."""
    return f"prompt {n}: " + "many words " * 200


def _slice(name: str, service: str, pod: str, url: str, bootstrap: int = 8998) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": "http", "port": int(url.rsplit(":", 1)[1])},
                      {"name": "bootstrap", "port": bootstrap}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "name": pod, "namespace": NS}}]}


def _names(discovery: KubernetesDiscovery) -> dict[str, list[str]]:
    membership = discovery.membership()
    names = {g: [e.name for e in membership.groups[g]] for g in CLASSES}
    names["decode"] = [e.name for e in membership.decode]
    return names


def _slice_requests(kube_api, *, watch: bool) -> list:
    return [r for r in list(kube_api.emulator) if "endpointslices" in str(r.url)
            and r.method.upper() == "GET"
            and (r.params.get("watch") in ("true", "True", "1")) == watch]


class WatchGate:
    """Holds every EndpointSlice watch request at the API server until opened: the gateway's
    connection is stalled (a partition, an overloaded API server) while the cluster moves on.
    Lists pass, as do watches once the gate is open."""

    def __init__(self, kube_api) -> None:
        self.opened = threading.Event()
        self.held = 0  # watch requests that reached the gate

        async def hold():
            self.held += 1
            await asyncio.to_thread(self.opened.wait, 60)
            # No content: not an answer, so the emulator serves the request as usual.

        kube_api.call(lambda: kube_api.emulator[kmock.action.WATCH, SLICES] << hold)

    def open(self) -> None:
        self.opened.set()


def _run_discovery(discovery: KubernetesDiscovery, scenario) -> None:
    async def main() -> None:
        await discovery.start()
        try:
            await asyncio.to_thread(scenario)
        finally:
            await discovery.stop()
    asyncio.run(main())


def test_expired_watch_relists_and_sees_a_pod_moved_meanwhile(kube_api, stub_engines, caplog):
    caplog.set_level(logging.INFO, logger="laps_agent.gateway.discovery.kubernetes")
    api = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    pod_a, _ = stub_engines("prefill")
    pod_b, _ = stub_engines("prefill")
    decode, _ = stub_engines("decode")
    api.create_namespaced_endpoint_slice(NS, _slice("short-a", SERVICES.prefill_short, "pf-0", pod_a.url))
    api.create_namespaced_endpoint_slice(NS, _slice("long-b", SERVICES.prefill_long, "pf-1", pod_b.url))
    api.create_namespaced_endpoint_slice(NS, _slice("decode-0", SERVICES.decode, "dc-0", decode.url))
    # The server ends each watch after 1 s, so the discovery soon has to resume one.
    discovery = KubernetesDiscovery(SERVICES, namespace=NS, api_client=kube_api.api_client(),
                                    watch_timeout_s=1)

    def scenario() -> None:
        poll(lambda: _names(discovery) == {"short": ["pf-0"], "long": ["pf-1"], "decode": ["dc-0"]},
             message="the first listing")
        gate = WatchGate(kube_api)
        try:
            poll(lambda: gate.held, message="the discovery to resume its watch")
            # Meanwhile the operator moves pf-0 to long, then etcd compacts that history away
            # (compacting first would keep the watch's own revision, which stays resumable):
            # resuming from the old resourceVersion now gets 410 Expired.
            api.delete_namespaced_endpoint_slice("short-a", NS)
            api.create_namespaced_endpoint_slice(
                NS, _slice("long-a", SERVICES.prefill_long, "pf-0", pod_a.url))
            kube_api.compact()
            assert _names(discovery)["short"] == ["pf-0"]  # it has not heard yet
        finally:
            gate.open()
        poll(lambda: _names(discovery) == {"short": [], "long": ["pf-0", "pf-1"], "decode": ["dc-0"]},
             message="the re-list after 410 to show the move")
        assert len(_slice_requests(kube_api, watch=False)) == 2  # the first listing and the re-list
        assert "watch expired; re-listing" in caplog.text  # 410, not some other error, led here

        # After the re-list it watches again: later changes still arrive.
        api.create_namespaced_endpoint_slice(NS, _slice("short-b", SERVICES.prefill_short, "pf-1", pod_b.url))
        api.delete_namespaced_endpoint_slice("long-b", NS)
        poll(lambda: _names(discovery) == {"short": ["pf-1"], "long": ["pf-0"], "decode": ["dc-0"]},
             message="a change after the re-list")

    _run_discovery(discovery, scenario)


def test_stalled_watch_is_abandoned_and_membership_catches_up(kube_api, stub_engines):
    api = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    pod_a, _ = stub_engines("prefill")
    decode, _ = stub_engines("decode")
    api.create_namespaced_endpoint_slice(NS, _slice("short-a", SERVICES.prefill_short, "pf-0", pod_a.url))
    api.create_namespaced_endpoint_slice(NS, _slice("decode-0", SERVICES.decode, "dc-0", decode.url))
    # A watch may be silent for its whole timeout, never longer: one silent for 1 s + 1 s of
    # slack is dead (a half-open connection looks exactly like this) and must be replaced.
    discovery = KubernetesDiscovery(SERVICES, namespace=NS, api_client=kube_api.api_client(),
                                    watch_timeout_s=1, read_slack_s=1.0, retry_s=0.1)
    gate = WatchGate(kube_api)  # never opened before the end: every watch hangs

    def scenario() -> None:
        poll(lambda: _names(discovery)["short"] == ["pf-0"], message="the first listing")
        poll(lambda: gate.held, message="a watch to hang")
        api.delete_namespaced_endpoint_slice("short-a", NS)
        api.create_namespaced_endpoint_slice(NS, _slice("long-a", SERVICES.prefill_long, "pf-0", pod_a.url))
        poll(lambda: _names(discovery) == {"short": [], "long": ["pf-0"], "decode": ["dc-0"]},
             message="a re-list to replace the hanging watch")

    try:
        _run_discovery(discovery, scenario)
    finally:
        gate.open()


def _status_groups(client: httpx.Client, url: str) -> dict[str, list[str]]:
    status = client.get(f"{url}/laps_status").json()
    groups = {g: sorted(p["name"] for p in status["groups"][g]["pods"]) for g in CLASSES}
    groups["decode"] = sorted(p["name"] for p in status["decode"]["pods"])
    return groups


def test_gateway_process_follows_endpoint_slices(kube_api, stub_engines, gateway_process):
    core = kubernetes.client.CoreV1Api(kube_api.api_client())
    slices_api = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    # In-thread stub engines (the gateway under test is the process): the test sees which
    # engine each request reached.
    engines, servers = {}, {}
    handoff = KVHandoff()  # the decode stub answers a room only once a prefill stub finished it
    for name, group, bootstrap in (("pf-0", "short", 7000), ("pf-1", "short", 7001), ("pf-2", "long", 7002)):
        servers[name], engines[name] = stub_engines("prefill", bootstrap_port=bootstrap, handoff=handoff)
        start_pod(core, stub_pod(name, "prefill", servers[name].port, group=group,
                                 bootstrap_port=bootstrap))
    servers["dc-0"], engines["dc-0"] = stub_engines("decode", handoff=handoff)
    start_pod(core, stub_pod("dc-0", "decode", servers["dc-0"].port))
    create_operator_services(core)
    sync_endpoint_slices(core, slices_api)

    # $KUBECONFIG (set by kube_api) points the process at the emulator.
    assert os.environ["KUBECONFIG"] == str(kube_api.kubeconfig)
    gateway = gateway_process(
        "--discovery", "kubernetes", "--namespace", NS,
        "--prefill-short-service", SERVICES.prefill_short,
        "--prefill-long-service", SERVICES.prefill_long, "--decode-service", SERVICES.decode,
        "--host", "127.0.0.1", "--port", "0", "--length-threshold", "64")
    url = gateway.wait_listening()
    client = httpx.Client(trust_env=False, timeout=30)

    def wait_for_groups(expected: dict[str, list[str]]) -> None:
        try:
            poll(lambda: _status_groups(client, url) == expected, timeout=30,
                 message=f"/laps_status to show {expected}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it shows {_status_groups(client, url)}; "
                                 f"gateway output:\n{gateway.output()}") from None

    try:
        wait_for_groups({"short": ["pf-0", "pf-1"], "long": ["pf-2"], "decode": ["dc-0"]})
        pods = {p["name"]: p for g in client.get(f"{url}/laps_status").json()["groups"].values()
                for p in g["pods"]}
        assert pods["pf-2"]["url"] == servers["pf-2"].url and pods["pf-2"]["bootstrap_port"] == 7002

        def complete(prompt: str) -> None:
            reply = client.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 2})
            assert reply.status_code == 200, reply.text

        def served() -> dict[str, int]:
            return {name: len(engines[name].requests) for name in ("pf-0", "pf-1", "pf-2")}

        for _ in range(2):
            complete("hi")
        complete(long_prompt(0))
        assert served() == {"pf-0": 1, "pf-1": 1, "pf-2": 1}  # short ones shared, long on pf-2
        assert engines["dc-0"].requests[-1]["bootstrap_port"] == 7002

        # The operator moves pf-1 to the long group; its endpoint follows to the long slice.
        core.patch_namespaced_pod("pf-1", NS, {"metadata": {"labels": {GROUP_LABEL: "long"}}})
        sync_endpoint_slices(core, slices_api)
        wait_for_groups({"short": ["pf-0"], "long": ["pf-1", "pf-2"], "decode": ["dc-0"]})
        before = served()
        for _ in range(2):
            complete("hi")
        assert served()["pf-1"] == before["pf-1"]  # short prompts no longer go to pf-1
        assert served()["pf-0"] == before["pf-0"] + 2
        for n in range(4):  # long prompts now reach pf-1 too
            complete(long_prompt(1 + n))
        assert served()["pf-1"] > before["pf-1"]
        assert served()["pf-1"] + served()["pf-2"] == before["pf-1"] + before["pf-2"] + 4
    finally:
        client.close()

    # SIGTERM, as Kubernetes stops a pod: a graceful shutdown (the watch thread joined in
    # time), then uvicorn ends the process by that same signal, as is the convention.
    gateway.proc.send_signal(signal.SIGTERM)
    assert gateway.proc.wait(30) in (0, -signal.SIGTERM), gateway.output()
    output = gateway.output()
    assert "Application shutdown complete" in output, output
    assert "did not stop" not in output and "Traceback" not in output, output
    poll(lambda: not gateway.group_alive(), message="no process left in the gateway's group")


def test_api_server_failing_at_first_is_retried_until_it_answers(kube_api, stub_engines, caplog):
    caplog.set_level(logging.WARNING, logger="laps_agent.gateway.discovery.kubernetes")
    api = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    prefill, _ = stub_engines("prefill")
    api.create_namespaced_endpoint_slice(NS, _slice("short-a", SERVICES.prefill_short, "pf-0", prefill.url))
    # The API server (or its load balancer) answers 503 to the first three reads.
    kube_api.call(lambda: kube_api.emulator["get", SLICES][:3] << 503)
    discovery = KubernetesDiscovery(SERVICES, namespace=NS, api_client=kube_api.api_client(),
                                    retry_s=0.05)

    def scenario() -> None:
        poll(lambda: _names(discovery)["short"] == ["pf-0"], message="the membership after the 503s")
        assert caplog.text.count("retrying in") == 3  # each failure said so, none was fatal

    _run_discovery(discovery, scenario)
