"""schemathesis drives the gateway's own OpenAPI with generated (mostly bad) input: whatever
arrives, the gateway answers without a 5xx, in front of live stub engines."""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from laps_agent.gateway.app import create_app
from laps_agent.gateway.config import GatewayConfig
from laps_agent.gateway.discovery import StaticDiscovery, StaticSpec
from laps_agent.gateway.estimate import TokenEstimator
from laps_agent.gateway.serving import ServerThread
from tests.support.stub_engine import StubEngine
from tests.support.fixtures_gateway import poll

_CONFIG = GatewayConfig(served_model_name="default", max_body_bytes=64 * 1024)


def _app(spec: StaticSpec):
    return create_app(_CONFIG, StaticDiscovery(spec, poll_s=0.05), TokenEstimator(None))


schema = schemathesis.openapi.from_dict(_app(StaticSpec((), (), ())).openapi())


@pytest.fixture(scope="module")
def fuzz_gateway():
    servers = [ServerThread(StubEngine(role)).start() for role in ("prefill", "prefill", "decode")]
    spec = StaticSpec((servers[0].url,), (servers[1].url,), (servers[2].url,))
    app = _app(spec)
    gateway = ServerThread(app).start()
    servers.append(gateway)
    try:
        # Ready (a prefill and a decode pod), so /health answers 200 rather than 503 "not ready".
        poll(lambda: httpx.get(gateway.url + "/health").status_code == 200, message="stub pods")
        yield gateway.url
    finally:
        for server in reversed(servers):
            server.stop()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_input_never_gets_a_5xx(case, fuzz_gateway):
    response = case.call(base_url=fuzz_gateway, timeout=30)
    case.validate_response(response, checks=[not_a_server_error])
