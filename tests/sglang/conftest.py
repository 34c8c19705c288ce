"""Fixtures for the tests against real SGLang (marker `sglang`). Servers are few and shared:
one decode server for tests/sglang, one prefill server per module (plugin on, plugin off), so
at most two ~5 GB servers serve at once (a third may be exiting). Without .venv-sglang the
tests FAIL saying how to get it (`make test` builds it): a missing SGLang must never pass as a
skip."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.sglang.servers import SGLangServer, setup_problem

HERE = Path(__file__).resolve().parent


def require_sglang() -> None:
    problem = setup_problem()
    if problem:
        pytest.fail(f"real SGLang is not set up: {problem}", pytrace=False)


@pytest.fixture(scope="session")
def sglang_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("sglang")


@pytest.fixture(scope="session")
def retire():
    """retire(server): tell it to stop (SIGTERM) and reap it on a thread: SGLang takes ~5 s to
    exit, which it does while the next tests run (the reaping kills what of its process group
    outlives it, as `stop` does). Every one is reaped before the session ends."""
    reaping: list[threading.Thread] = []

    def retire_server(server: SGLangServer) -> None:
        server.terminate()
        thread = threading.Thread(target=server.reap, name=f"reap-{server.role}-{server.port}")
        thread.start()
        reaping.append(thread)

    yield retire_server
    for thread in reaping:
        thread.join()


DECODE_PLUGIN_ENV = {"LAPS_SCHEDULER": "1", "LAPS_LENGTH_THRESHOLD": "256", "LAPS_SLO": "short=0.5,long=3.0"}


# Package scope: shared by every module here, and gone before the rest of the suite runs.
@pytest.fixture(scope="package")
def decode_launched(sglang_logs, retire):
    require_sglang()
    # With the plugin's decode order on, as the operator renders a decode pod's environment.
    server = SGLangServer("decode", sglang_logs, env=DECODE_PLUGIN_ENV)
    yield server
    retire(server)


@pytest.fixture(scope="package", autouse=True)
def launch_decode_early(request):
    """Where a test of this package needs the decode server, launch it as the package begins:
    it loads (~25 s, about one core) while the tests that need no server run (test_compat's)."""
    wanted = any("decode_server" in getattr(item, "fixturenames", ()) and HERE in item.path.parents
                 for item in request.session.items)
    if wanted and setup_problem() is None:
        request.getfixturevalue("decode_launched")


@pytest.fixture(scope="package")
def decode_server(decode_launched):
    return decode_launched.wait_ready()


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
