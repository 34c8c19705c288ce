"""Holding one kind of request at the emulated API server until a test opens the gate: a slow
answer (a LIST that returns late, a PATCH still on its way) at the moment the test chooses."""
from __future__ import annotations

import asyncio
import threading

import kmock


class ApiGate:
    """Holds every `verb` request for core/v1 `plural` until opened; what it then answers is the
    store as of then. `held` counts the requests that reached it."""

    def __init__(self, kube_api, verb: str, plural: str) -> None:
        self.opened = threading.Event()
        self.held = 0

        async def hold():
            self.held += 1
            await asyncio.to_thread(self.opened.wait, 30)
            # No content: not an answer, so the emulator serves the request as usual.

        kube_api.call(lambda: kube_api.emulator[verb, kmock.resource("", "v1", plural)] << hold)
