"""Kubernetes discovery against the API emulator: the gateway follows EndpointSlices as they
change, so moving a prefill pod to the other group changes where requests go."""
from __future__ import annotations

import logging

import httpx
import kubernetes

from laps_agent.gateway.discovery.kubernetes import KubernetesDiscovery, ServiceNames
from laps_agent.policy.classes import CLASSES
from tests.support.fixtures_gateway import poll

NS = "default"
SERVICES = ServiceNames("c-prefill-short", "c-prefill-long", "c-decode")


def _slice(name: str, service: str, pod: str, url: str, *, ready: bool = True,
           bootstrap: int | None = 8998) -> dict:
    port = int(url.rsplit(":", 1)[1])
    ports = [{"name": "http", "port": port, "protocol": "TCP"}]
    if bootstrap is not None:
        ports.append({"name": "bootstrap", "port": bootstrap, "protocol": "TCP"})
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": ports,
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready},
                           "targetRef": {"kind": "Pod", "name": pod, "namespace": NS}}]}


def _groups(gateway) -> dict[str, list[str]]:
    status = httpx.get(f"{gateway.url}/laps_status").json()
    groups = {g: [p["name"] for p in status["groups"][g]["pods"]] for g in CLASSES}
    groups["decode"] = [p["name"] for p in status["decode"]["pods"]]
    return groups


def test_relabelled_pod_changes_routing(kube_api, stub_engines, gateway_server):
    api = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    pod_a, engine_a = stub_engines("prefill", bootstrap_port=7001)
    pod_b, engine_b = stub_engines("prefill", bootstrap_port=7002)
    decode, decode_engine = stub_engines("decode")
    api.create_namespaced_endpoint_slice(NS, _slice("short-a", SERVICES.prefill_short, "pf-0", pod_a.url, bootstrap=7001))
    api.create_namespaced_endpoint_slice(NS, _slice("long-b", SERVICES.prefill_long, "pf-1", pod_b.url, bootstrap=7002))
    api.create_namespaced_endpoint_slice(NS, _slice("decode-0", SERVICES.decode, "dc-0", decode.url, bootstrap=None))
    # Not ready, and another cluster's Service: neither may show up.
    api.create_namespaced_endpoint_slice(NS, _slice("short-x", SERVICES.prefill_short, "pf-9", pod_b.url, ready=False))
    api.create_namespaced_endpoint_slice(NS, _slice("other", "other-prefill-short", "zz-0", pod_b.url))

    gateway = gateway_server(KubernetesDiscovery(SERVICES, namespace=NS,
                                                 api_client=kube_api.api_client()),
                             length_threshold=64)
    assert _groups(gateway) == {"short": ["pf-0"], "long": ["pf-1"], "decode": ["dc-0"]}
    assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"}).status_code == 200
    # The gateway answers with decode's reply without waiting for the prefill call to be logged
    # by the stub, so poll for the prefill side's record.
    poll(lambda: len(engine_a.requests) == 1, message="pf-0 to record the request")
    assert not engine_b.requests
    assert decode_engine.requests[0]["bootstrap_port"] == 7001

    # The operator moves pf-0 to long and pf-1 to short: the Services' slices follow.
    api.delete_namespaced_endpoint_slice("short-a", NS)
    api.delete_namespaced_endpoint_slice("long-b", NS)
    api.create_namespaced_endpoint_slice(NS, _slice("long-a", SERVICES.prefill_long, "pf-0", pod_a.url, bootstrap=7001))
    api.create_namespaced_endpoint_slice(NS, _slice("short-b", SERVICES.prefill_short, "pf-1", pod_b.url, bootstrap=7002))
    poll(lambda: _groups(gateway) == {"short": ["pf-1"], "long": ["pf-0"], "decode": ["dc-0"]},
         message="the relabel to reach the gateway")
    assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"}).status_code == 200
    poll(lambda: len(engine_b.requests) == 1, message="pf-1 to record the request")
    assert len(engine_a.requests) == 1
    assert decode_engine.requests[1]["bootstrap_port"] == 7002

    # A pod turning unready leaves its group at once.
    api.patch_namespaced_endpoint_slice("short-b", NS, {"endpoints": [{
        "addresses": ["127.0.0.1"], "conditions": {"ready": False},
        "targetRef": {"kind": "Pod", "name": "pf-1", "namespace": NS}}]})
    poll(lambda: _groups(gateway)["short"] == [], message="the unready pod to leave")
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"})
    assert reply.status_code == 200  # falls back to the long group
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'laps_gateway_fallbacks_total{class="short"} 1.0' in metrics


def test_watch_resumes_after_timing_out(kube_api, stub_engines):
    import asyncio

    api = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    prefill, _ = stub_engines("prefill")
    api.create_namespaced_endpoint_slice(NS, _slice("short-a", SERVICES.prefill_short, "pf-0", prefill.url))
    discovery = KubernetesDiscovery(SERVICES, namespace=NS, api_client=kube_api.api_client(),
                                    watch_timeout_s=1)

    def slice_watches() -> list:
        return [r for r in list(kube_api.emulator)
                if "endpointslices" in str(r.url) and r.params.get("watch") in ("true", "True", "1")]

    async def scenario() -> None:
        await discovery.start()
        try:
            # The server ends each watch after 1 s; the discovery must watch again from where
            # it was (resourceVersion), not miss what happens in between.
            watches = await asyncio.to_thread(poll, lambda: len(slice_watches()) >= 2 and slice_watches(),
                                              message="a second watch")
            assert all(w.params.get("resourceVersion") for w in watches)
            api.create_namespaced_endpoint_slice(NS, _slice("long-a", SERVICES.prefill_long, "pf-1", prefill.url))
            await asyncio.to_thread(poll, lambda: [e.name for e in discovery.membership().groups["long"]] == ["pf-1"],
                                    message="the new slice")
            assert [e.name for e in discovery.membership().groups["short"]] == ["pf-0"]
        finally:
            await discovery.stop()

    asyncio.run(scenario())


def test_the_gateway_forgets_the_pods_of_past_rollouts(kube_api, stub_engines, gateway_server):
    """Every rollout brings new pod names: a long-lived gateway keeps records only of the pods it
    has now, and of departed ones while its requests still run there. Such a request finishes
    cleanly, and a name that comes back starts from nothing in flight."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.stub_engine import KVHandoff

    api = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    gate, handoff = threading.Event(), KVHandoff(timeout_s=120)
    held_pod, held_engine = stub_engines("prefill", handoff=handoff, prefill_gate=gate)
    prefill, _ = stub_engines("prefill", handoff=handoff)
    decode, _ = stub_engines("decode", handoff=handoff)

    def roll_out(generation: int, prefill_url: str, *, first: bool = False) -> None:
        """The pods of `generation` replace the previous ones (new names, as a rollout's)."""
        for name, service, pod, url, bootstrap in (
                ("short", SERVICES.prefill_short, f"pf-{generation}", prefill_url, 8998),
                ("decode", SERVICES.decode, f"dc-{generation}", decode.url, None)):
            body = _slice(name, service, pod, url, bootstrap=bootstrap)
            if first:
                api.create_namespaced_endpoint_slice(NS, body)
            else:
                api.patch_namespaced_endpoint_slice(name, NS, {"endpoints": body["endpoints"],
                                                               "ports": body["ports"]})

    roll_out(0, held_pod.url, first=True)
    gateway = gateway_server(KubernetesDiscovery(SERVICES, namespace=NS, api_client=kube_api.api_client()),
                             length_threshold=64)
    tracker = gateway.gateway.tracker
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(httpx.post, f"{gateway.url}/v1/completions", json={"prompt": "hi"}, timeout=120)
        poll(lambda: len(held_engine.requests) == 1, message="the request held on pf-0")
        for generation in range(1, 11):
            roll_out(generation, prefill.url)
            pods = {"short": [f"pf-{generation}"], "long": [], "decode": [f"dc-{generation}"]}
            poll(lambda pods=pods: _groups(gateway) == pods, message=f"rollout {generation} to reach the gateway")
            assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"}).status_code == 200
        # pf-0 and dc-0 left long ago but still hold the first request; every other one is gone.
        assert set(tracker.loads()) == tracker.pods() == {"pf-0", "dc-0", "pf-10", "dc-10"}
        gate.set()
        assert held.result().status_code == 200
    poll(lambda: tracker.pods() == {"pf-10", "dc-10"}, message="pf-0 and dc-0 forgotten once idle")

    roll_out(0, prefill.url)   # the old names come back, as new pods
    poll(lambda: _groups(gateway) == {"short": ["pf-0"], "long": [], "decode": ["dc-0"]},
         message="pf-0 and dc-0 back")
    assert httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"}).status_code == 200
    status = httpx.get(f"{gateway.url}/laps_status").json()
    assert status["groups"]["short"]["pods"][0]["pending_requests"] == 0
    assert status["decode"]["pods"][0]["pending_requests"] == 0
    assert status["decode"]["held_here"] == {"short": 0, "long": 0}


def test_losing_every_decode_pod_is_one_warning_not_one_per_request(kube_api, stub_engines, gateway_server,
                                                                      caplog):
    """Every request then gets 503 no_endpoint, logged per request at debug only (proxy.py: the
    same refusal comes by the thousand under overload); the outage itself is one warning."""
    api = kubernetes.client.DiscoveryV1Api(kube_api.api_client())
    prefill, _ = stub_engines("prefill", bootstrap_port=7001)
    decode, _ = stub_engines("decode")
    api.create_namespaced_endpoint_slice(NS, _slice("short-a", SERVICES.prefill_short, "pf-0", prefill.url,
                                                    bootstrap=7001))
    api.create_namespaced_endpoint_slice(NS, _slice("decode-0", SERVICES.decode, "dc-0", decode.url, bootstrap=None))
    gateway = gateway_server(KubernetesDiscovery(SERVICES, namespace=NS, api_client=kube_api.api_client()),
                             length_threshold=64)
    poll(lambda: _groups(gateway)["decode"] == ["dc-0"], message="the decode pod to join")
    caplog.set_level(logging.INFO, logger="laps_agent")
    api.delete_namespaced_endpoint_slice("decode-0", NS)
    poll(lambda: _groups(gateway)["decode"] == [], message="the decode pod to leave")
    for _ in range(3):
        reply = httpx.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"})
        assert reply.status_code == 503 and "no usable decode pod" in reply.json()["error"]["message"], reply.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["membership: short=['pf-0'] long=[] decode=[] (no ready decode pod: requests get 503)"]
