"""Asking stock SGLang pods their prompt limit (gateway/sglang_limit.py): one ask per pod at a
time, and none left running once the gateway stops, also when a pod left and came back while
it was being asked."""
from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from laps_agent.gateway.proxy.engine_load import EngineLoads
from laps_agent.gateway.proxy.sglang_limit import SGLangLimits
from laps_agent.policy.routing import Endpoint
from tests.support.waiting import poll


@pytest.fixture
def silent_pod():
    """(url, connections): a pod that accepts connections and never answers (an SGLang busy
    with its /server_info); `connections` lists those accepted."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)   # how often the accept loop looks at `stop`
    connections: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connections.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", connections
    stop.set()
    thread.join()
    listener.close()
    for connection in connections:
        connection.close()


async def test_a_pod_that_left_and_came_back_while_asked_is_asked_once_and_stop_ends_it(silent_pod):
    url, connections = silent_pod
    limits = SGLangLimits(EngineLoads(0.25))
    pod = Endpoint("pod-0", url, "127.0.0.1", None)
    before = asyncio.all_tasks()
    limits.ask(pod)
    (first,) = asyncio.all_tasks() - before
    await asyncio.to_thread(poll, lambda: len(connections) == 1, message="the pod asked")
    limits.keep_only([])   # the pod left (its ask cancelled) ...
    limits.ask(pod)        # ... and came back while that ask was still ending
    (second,) = asyncio.all_tasks() - before - {first}
    await asyncio.gather(first, return_exceptions=True)
    assert first.cancelled()
    limits.ask(pod)        # being asked (by `second`): not a third ask beside it
    assert asyncio.all_tasks() - before - {first} == {second}
    await limits.stop()
    assert second.done()   # nothing asks the pod after the gateway stopped
