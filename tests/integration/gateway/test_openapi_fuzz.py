"""schemathesis drives the gateway's own OpenAPI with generated (mostly bad) input: whatever
arrives, the gateway answers without a 5xx, in front of live stub engines."""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from laps_agent.gateway.config import GatewayConfig
from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
from laps_agent.gateway.estimate import TokenEstimator
from laps_agent.gateway.http.app import create_app
from laps_agent.serving.listen import ServerThread
from tests.support.fixtures_gateway import poll
from tests.support.stub_engine import StubEngine

_CONFIG = GatewayConfig(served_model_name="default", max_body_bytes=64 * 1024)


_KEY = "sk-fuzz-0123456789"


def _app(spec: StaticSpec, config: GatewayConfig = _CONFIG):
    return create_app(config, StaticDiscovery(spec, poll_s=0.05), TokenEstimator(None))


schema = schemathesis.openapi.from_dict(_app(StaticSpec((), (), ())).openapi())


@pytest.fixture(scope="module", params=["open", "auth"])
def fuzz_gateway(request, tmp_path_factory):
    """The gateway without authentication, and with it (API keys on; the fuzzer sends a valid
    key, so its input reaches the handlers): (url, headers)."""
    config, headers = _CONFIG, {}
    if request.param == "auth":
        keys = tmp_path_factory.mktemp("keys") / "api-keys"
        keys.write_text(_KEY + "\n")
        config = GatewayConfig(served_model_name="default", max_body_bytes=64 * 1024,
                               api_keys_file=str(keys), rate_limit_per_key=1000.0)
        headers = {"Authorization": f"Bearer {_KEY}"}
    servers = [ServerThread(StubEngine(role)).start() for role in ("prefill", "prefill", "decode")]
    spec = StaticSpec((servers[0].url,), (servers[1].url,), (servers[2].url,))
    app = _app(spec, config)
    gateway = ServerThread(app).start()
    servers.append(gateway)
    try:
        # Ready (a prefill and a decode pod), so /health answers 200 rather than 503 "not ready".
        poll(lambda: httpx.get(gateway.url + "/health").status_code == 200, message="stub pods")
        yield gateway.url, headers
    finally:
        for server in reversed(servers):
            server.stop()


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_input_never_gets_a_5xx(case, fuzz_gateway):
    url, headers = fuzz_gateway
    response = case.call(base_url=url, headers=headers, timeout=30)
    if headers:  # the key was accepted: what the fuzzer sent reached the gateway's handlers
        assert response.status_code != 401
    case.validate_response(response, checks=[not_a_server_error])
