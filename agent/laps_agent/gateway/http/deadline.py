"""The total request deadline (--request-deadline-s): arrival to the last byte of the answer.

Before the first byte reaches the client, a request over its deadline is cancelled where it is
(reading the body, waiting for a pod, prefill, the KV hand-off: both upstream calls are closed,
so the engines see the hang-up and drop the work) and the client gets 504 naming the deadline,
marked not to be retried (`x-should-retry: false`, which OpenAI's SDKs obey).
Once a stream has begun its status line is gone: it ends with an SSE error event of type
`deadline_exceeded` and without `[DONE]`. The engines are not told the deadline: closing the
upstream calls is what makes them stop, and costs them nothing to learn."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.proxy.failures import GatewayError
from laps_agent.gateway.proxy.relay import RelayResponse
from laps_agent.gateway.proxy.replies import StreamReply, sse_error

T = TypeVar("T")
REASON = "deadline_exceeded"   # laps_gateway_errors_total{reason}, and the SSE error's type


class RequestDeadline:
    """One request's deadline, started on arrival; `seconds` <= 0: none."""

    def __init__(self, seconds: float, metrics: GatewayMetrics) -> None:
        self.seconds, self._metrics = seconds, metrics
        # The loop's own clock, the one asyncio.timeout_at reads (uvloop's is not time.monotonic).
        self.at = asyncio.get_running_loop().time() + seconds if seconds > 0 else None

    def message(self) -> str:
        return (f"the request did not complete within its {self.seconds:g}s deadline "
                f"(the gateway's --request-deadline-s)")

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await it within the deadline: GatewayError 504 when it runs out first."""
        if self.at is None:
            return await awaitable
        try:
            async with asyncio.timeout_at(self.at) as scope:
                return await awaitable
        except TimeoutError:
            if not scope.expired():
                raise  # not ours
            # Not to be resent by the client's SDK: a retry would take the whole deadline again
            # (tripling the time to an answer with OpenAI's SDK defaults) and redo the work.
            raise GatewayError(504, REASON, self.message(), no_retry=True) from None

    def bound(self, response: T) -> T:
        """A streamed answer ends at the deadline; anything else is already complete."""
        if self.at is None or not isinstance(response, RelayResponse):
            return response
        reply = response.reply
        return RelayResponse(StreamReply(self._chunks(reply.chunks), reply.close), stall_s=response.stall_s,
                             until=self.at, stalled=response.stalled)

    async def _chunks(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            while True:
                try:
                    async with asyncio.timeout_at(self.at) as scope:
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if not scope.expired():
                        raise
                    self._metrics.errors.labels(REASON).inc()
                    yield sse_error(self.message(), REASON)
                    return
                yield chunk
        finally:
            await chunks.aclose()
