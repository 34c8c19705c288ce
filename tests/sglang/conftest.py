"""Fixtures for the tests against real SGLang (marker `sglang`). Servers are few and shared:
one decode server for tests/sglang, one prefill server per module (plugin on, plugin off), so
at most two ~5 GB servers run at once. Without .venv-sglang the tests FAIL saying how to get it
(`make test` builds it): a missing SGLang must never pass as a skip."""
from __future__ import annotations

import pytest

from tests.sglang.servers import SGLangServer, setup_problem


def require_sglang() -> None:
    problem = setup_problem()
    if problem:
        pytest.fail(f"real SGLang is not set up: {problem}", pytrace=False)


@pytest.fixture(scope="session")
def sglang_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("sglang")


# Package scope: shared by every module here, and gone before the rest of the suite runs.
@pytest.fixture(scope="package")
def decode_server(sglang_logs):
    require_sglang()
    server = SGLangServer("decode", sglang_logs)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def start_prefill(log_dir, env: dict[str, str]) -> SGLangServer:
    require_sglang()
    return SGLangServer("prefill", log_dir, env=env)


@pytest.fixture(scope="module")
def gateway_for():
    """gateway_for(prefill, decode, short=None) -> URL of this project's gateway in front of them
    (both prefill groups point at the one prefill server; with `short`, the short group is those
    URLs and the prefill server is the long group's only pod)."""
    from laps_agent.gateway.config import GatewayConfig
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
    from laps_agent.gateway.estimate import TokenEstimator
    from laps_agent.gateway.http.app import create_app
    from laps_agent.serving.listen import ServerThread
    from tests.support.waiting import poll

    started = []

    def start(prefill: SGLangServer, decode: SGLangServer, short: tuple[str, ...] | None = None) -> str:
        discovery = StaticDiscovery(StaticSpec(short or (prefill.url,), (prefill.url,), (decode.url,)), poll_s=0.2)
        app = create_app(GatewayConfig(served_model_name="smollm2", request_deadline_s=300.0),
                         discovery, TokenEstimator(None))
        server = ServerThread(app).start()
        started.append(server)
        # The gateway's membership leaves out a pod that does not answer: with `short` down, the
        # long group and decode only.
        serving = ("long",) if short else ("short", "long")
        poll(lambda: discovery.membership().decode and all(discovery.membership().groups.get(g) for g in serving),
             timeout=30, message="the gateway to see the SGLang servers")
        return server.url

    yield start
    for server in started:
        server.stop()
