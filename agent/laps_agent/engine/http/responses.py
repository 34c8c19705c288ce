"""How an EngineServer's outputs reach the client: the whole JSON body of a non-streaming request,
and the SSE events of a streaming one, for /generate, /v1/completions and /v1/chat/completions.

Separate from server.py because it is pure rendering: it only turns `EngineOutput`s into the API's
bodies (api_models.py), logging a failure a stream carries, and never touches the engine, the
queue bound or the PD hand-off."""
from __future__ import annotations

import time
from typing import AsyncGenerator, AsyncIterator

from laps_agent.engine.core.requests import EngineOutput, GenerateWork
from laps_agent.engine.http import api_models as api
from laps_agent.engine.http.util import log_failure, sse


def response_id(parsed: api.ParsedRequest, work: GenerateWork) -> str:
    """The OpenAI-style id of a completion: the engine's request id, prefixed by its kind."""
    return ("chatcmpl-" if parsed.kind == "chat" else "cmpl-") + work.rid


def final_body(work: GenerateWork, parsed: api.ParsedRequest, outs: list[EngineOutput],
               last: EngineOutput, extra: dict, started: float, model: str) -> dict:
    """The JSON answer of a non-streaming request, from all its outputs (`last` is the finished one)."""
    text = "".join(o.text for o in outs)
    ids = [t for o in outs for t in o.token_ids]
    if parsed.kind == "generate":
        return api.generate_body(work.rid, text, ids, last.finish_reason, last.matched_stop,
                                 last.prompt_tokens, last.completion_tokens, time.monotonic() - started, extra,
                                 cached=last.cached_tokens)
    return api.completion_body(response_id(parsed, work), model, text, api.openai_finish(last.finish_reason),
                               last.prompt_tokens, last.completion_tokens, chat=parsed.kind == "chat",
                               cached=last.cached_tokens)


async def sse_events(work: GenerateWork, parsed: api.ParsedRequest,
                     first_and_gen: tuple[EngineOutput, AsyncGenerator[EngineOutput, None]], extra: dict,
                     started: float, model: str) -> AsyncIterator[bytes]:
    """The SSE stream of a streaming request: `first` (already taken, so that up-front failures got
    a status code; server._first_output) then the rest of `gen`, which is closed at the end."""
    first, gen = first_and_gen
    chat = parsed.kind == "chat"
    oid = response_id(parsed, work)
    created = int(time.time())   # one for the whole stream
    text, ids = "", []
    last = first   # the latest output that is no error: what the usage chunk counts
    sent_role = False

    async def stream() -> AsyncIterator[EngineOutput]:
        yield first
        if not first.finished:
            async for out in gen:
                yield out

    try:
        async for out in stream():
            if out.error:
                # Past the status line: this event is all the client gets, so the log must name
                # the request (up-front failures are logged by http_util.failed).
                exc = api.ApiError(out.error_status, out.error, "engine_error")
                log_failure(work.request_id, exc, mid_stream=True)
                yield sse(exc.body())
                break
            last = out
            text += out.text
            ids += out.token_ids
            finish = api.openai_finish(out.finish_reason) if out.finished else None
            if parsed.kind == "generate":
                body = api.generate_body(work.rid, text, ids, out.finish_reason if out.finished else None,
                                         out.matched_stop, out.prompt_tokens, out.completion_tokens,
                                         time.monotonic() - started, extra, cached=out.cached_tokens)
            else:
                if not out.text and not out.finished and sent_role:
                    continue  # nothing new to show (text held back for a possible stop string)
                body = api.completion_body(oid, model, out.text, finish, 0, 0, chunk=True, chat=chat,
                                           first=not sent_role, with_usage=parsed.include_usage,
                                           created=created)
                sent_role = True
            yield sse(body)
        if parsed.include_usage and parsed.kind != "generate":
            yield sse(api.usage_chunk(oid, model, last.prompt_tokens, last.completion_tokens, chat,
                                      last.cached_tokens, created))
        yield b"data: [DONE]\n\n"
    finally:
        await gen.aclose()
