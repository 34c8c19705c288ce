"""Watch streams of the Kubernetes API emulator, as kube-apiserver serves `?watch=true`:
newline-delimited JSON events, `timeoutSeconds`, `resourceVersion`, selectors."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from tests.support import kube_emulator_rules as rules
from tests.support.kube_emulator_store import ObjectStore, ResourceRef, WatchEvent, WatchExpired

END_OF_WATCH = object()
# How often an idle watch checks whether its client has gone away.
_IDLE_CHECK_S = 0.5


def open_watch(store: ObjectStore, resource: ResourceRef, namespace: str | None,
               selector: Callable[[dict], bool], params: Mapping[str, str],
               client_gone: Callable[[], bool]) -> AsyncIterator[Any]:
    """Subscribe now (so no change after this request is missed) and return the stream."""
    raw_timeout = params.get("timeoutSeconds")
    try:
        timeout = float(raw_timeout) if raw_timeout else None
        since = int(params.get("resourceVersion") or "0")
    except ValueError:
        raise rules.bad_request("timeoutSeconds and resourceVersion must be integers") from None
    # Subscribing and taking the backlog happen with no await between them, so no event can
    # fall in between (the event loop is single-threaded).
    queue: asyncio.Queue[Any] = asyncio.Queue()
    try:
        backlog = store.subscribe(resource, queue, since)
    except WatchExpired as exc:
        return _expired(str(exc))
    return _stream(store, resource, namespace, selector, queue, backlog, timeout, client_gone)


async def _expired(message: str) -> AsyncIterator[Any]:
    # As kube-apiserver: 200, then one ERROR event carrying a 410 Status, then the end.
    yield {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                       "status": "Failure", "message": message,
                                       "reason": "Expired", "code": 410}}


async def _stream(store: ObjectStore, resource: ResourceRef, namespace: str | None,
                  selector: Callable[[dict], bool], queue: asyncio.Queue[Any],
                  backlog: list[WatchEvent], timeout: float | None,
                  client_gone: Callable[[], bool]) -> AsyncIterator[Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        yield b""  # send the headers now, even if no event comes
        for event in backlog:
            if (line := event.as_seen_by(namespace, selector)) is not None:
                yield line
        while True:
            wait = _IDLE_CHECK_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return  # timeoutSeconds: the server ends the stream, the client re-watches
            try:
                event = await asyncio.wait_for(queue.get(), wait)
            except TimeoutError:
                if client_gone():
                    return
                continue
            if event is END_OF_WATCH:
                return
            if (line := event.as_seen_by(namespace, selector)) is not None:
                yield line
    finally:
        store.unsubscribe(resource, queue)


def close_all_watches(store: ObjectStore) -> None:
    """End every open watch (as an API server does on shutdown)."""
    for queues in store.watchers.values():
        for queue in queues:
            queue.put_nowait(END_OF_WATCH)
