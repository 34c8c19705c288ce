"""The engine's HTTP routes over an EngineServer (server.py): work, health, info, load, metrics.

The server builds its app here (`build_app(self)`); this module knows the server only by what
the routes use of it (`RoutedServer`), so the import goes one way, server -> routes."""
from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from laps_agent.engine.core.load_report import HeldByClass, load_report
from laps_agent.engine.core.requests import GenerateWork, new_rid
from laps_agent.engine.core.sampling_params import SamplingParams
from laps_agent.engine.http import api_models as api
from laps_agent.engine.http.util import error, http_error
from laps_agent.engine.metrics import read_group
from laps_agent.policy.classes import CLASSES
from laps_agent.serving.drain import Drain, DrainGuard, refusal_body
from laps_agent.serving.request_id import tagged


class RoutedServer(Protocol):
    """What the routes use of server.py's EngineServer."""

    engine: Any          # server.ServedEngine
    settings: Any        # server.ServerSettings
    metrics: Any         # metrics.EngineMetrics
    tokenizer: Any
    drain: Drain
    outbox: Any          # pd.wire.KVOutbox
    fetching: int
    queued: int

    async def serve(self, request: Request, kind: str) -> Response: ...

    def outputs(self, work: GenerateWork) -> AsyncIterator[Any]: ...

    async def aclose(self) -> None: ...


class _EngineApp(FastAPI):
    """FastAPI giving each HTTP request its id (request_id.py) before anything else runs, so
    that every answer carries it: a guard's refusal, and the 500 of Starlette's own error
    middleware, which sits outside any middleware an app adds."""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            send = tagged(scope, send)
        await super().__call__(scope, receive, send)


def build_app(server: RoutedServer) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await server.aclose()

    app = _EngineApp(title="laps engine", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.add_exception_handler(HTTPException, http_error)   # 404/405 OpenAI-shaped
    held = dict.fromkeys(CLASSES, 0)   # work requests held per gateway class (/get_load)
    # Inside DrainGuard: a draining engine's refusals hold nothing.
    app.add_middleware(HeldByClass, held=held)
    app.add_middleware(DrainGuard, drain=server.drain, who="engine")
    s, engine = server.settings, server.engine

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        return await server.serve(request, "generate")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.serve(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await server.serve(request, "chat")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": s.served_model_name, "object": "model", "created": 0,
                                            "owned_by": "laps", "max_model_len": engine.config.context_len}]}

    @app.get("/health")
    async def health() -> Response:
        if server.drain.draining:  # out of every Service and gateway at once
            return JSONResponse({"status": "draining", "in_flight": server.drain.in_flight,
                                 **refusal_body("engine")}, status_code=503)
        if not engine.alive:
            return error(api.ApiError(503, "engine loop is not running", "unavailable"))
        return JSONResponse({"status": "ok", "role": s.role})

    @app.get("/health_generate")
    async def health_generate() -> Response:
        bos = server.tokenizer.bos_token_id
        work = GenerateWork(new_rid(), [bos if bos is not None else 0], SamplingParams(max_new_tokens=1, temperature=0.0))
        try:
            outs = [o async for o in server.outputs(work)]
        except Exception as exc:  # noqa: BLE001
            return error(api.ApiError(503, f"generation failed: {exc}", "unavailable"))
        if outs[-1].error:
            return error(api.ApiError(503, outs[-1].error, "unavailable"))
        return JSONResponse({"status": "ok"})

    @app.get("/get_server_info")
    async def server_info() -> dict:
        cfg = engine.config
        return {"role": s.role, "bootstrap_port": s.bootstrap_port if s.role == "prefill" else None,
                "backend": s.backend, "profile": s.profile,
                "prefill_group": read_group(s.labels_file), "served_model_name": s.served_model_name,
                "length_threshold": s.length_threshold, "laps_scheduler": cfg.scheduler.enabled,
                "scheduler": {k: getattr(cfg.scheduler, k) for k in cfg.scheduler.__dataclass_fields__},
                "max_prompt_tokens": engine.max_prompt_tokens(), "context_length": cfg.context_len,
                "kv_pages": engine.kv.num_pages, "page_size": engine.kv.page_size,
                "prefix_cache": getattr(engine.kv, "cache", None) is not None,
                "max_running_requests": cfg.max_running_requests, "batch_prefill_graphs": engine.grid is not None,
                "bootstrap_timeout_s": s.bootstrap_timeout_s,
                "bootstrap": {"pending_rooms": len(server.outbox), "fetching": server.fetching},
                "queue": {"waiting": server.queued + server.fetching, "bound": s.max_queued_requests},
                "draining": server.drain.draining,
                "state": dict(engine.snapshot, queues={
                    k: list(v) for k, v in (engine.snapshot.get("queues") or {}).items()})}

    @app.get("/get_load")
    async def get_load() -> Response:
        """What this engine holds now (engine/load_report.py); every gateway polls it, so it
        is answered as plain bytes (no response validation)."""
        return Response(json.dumps(load_report(s.role, engine.snapshot, server.fetching,
                                               engine.config.max_running_requests, held,
                                               engine.max_prompt_tokens(), s.bootstrap_timeout_s)),
                        media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(engine.snapshot), media_type="text/plain; version=0.0.4")

    return app
