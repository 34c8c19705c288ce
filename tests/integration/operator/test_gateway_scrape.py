"""The allocation loop's fallback pressure source: the Ready gateway pods' own /metrics, read
over HTTP (loopback servers stand in for the pods)."""
from __future__ import annotations

import pytest

from laps_operator.allocation.pressure import scrape_gateways
from laps_operator.naming import ClusterRef
from tests.support.get_server import GetServer
from tests.unit.operator.fake_kube import FakeKube
from tests.unit.operator.test_pressure import gateway_metrics_text


@pytest.fixture
def metrics_server():
    servers = []

    def start(text: str) -> int:
        servers.append(GetServer(lambda: ("text/plain", text.encode())))
        return servers[-1].port

    yield start
    for server in servers:
        server.close()


def gateway_pod(name: str, port: int, phase: str = "Running", ready: bool | None = None) -> dict:
    ready = phase == "Running" if ready is None else ready
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "labels": {
        "laps.io/cluster": "c", "laps.io/role": "gateway"}},
        "spec": {"containers": [{"name": "gateway", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": phase, "podIP": "127.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_scrape_sums_the_running_gateway_pods_and_an_unreachable_one_makes_it_unknown(metrics_server):
    kube = FakeKube()
    ref = ClusterRef("c", "ns", "u")
    assert scrape_gateways(kube, ref, 8000).reason == "NoGateway"
    kube.add(gateway_pod("c-gateway-1-a", metrics_server(gateway_metrics_text(1, 100))))
    kube.add(gateway_pod("c-gateway-1-b", metrics_server(gateway_metrics_text(2, 50))))
    kube.add(gateway_pod("c-gateway-1-c", 1, phase="Pending"))   # not running: not asked
    # Running but not Ready (starting, or crash-looping: the phase stays Running): the Service
    # sends it nothing, and one such replica made every reading unknown, stopping the loop.
    kube.add(gateway_pod("c-gateway-1-e", 9, ready=False))
    reading = scrape_gateways(kube, ref, 8000)
    assert reading.totals == {"short": 3.0, "long": 150.0} and reading.source == "gateways"

    kube.add(gateway_pod("c-gateway-1-d", 9))   # nothing listens on port 9
    down = scrape_gateways(kube, ref, 8000)
    assert down.reason == "GatewayUnreachable" and "c-gateway-1-d" in down.message
