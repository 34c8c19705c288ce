"""The gateway's HTTP face: OpenAI-compatible + SGLang endpoints, status and metrics."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from laps_agent.gateway.config import GatewayConfig
from laps_agent.gateway.discovery.membership import Discovery
from laps_agent.gateway.estimate import PromptCount, TokenEstimator
from laps_agent.gateway.http.auth import install_auth
from laps_agent.gateway.http.body import client_gone, read_body
from laps_agent.gateway.http.context import engines_limit, refuse_over_context
from laps_agent.gateway.http.deadline import RequestDeadline
from laps_agent.gateway.http.errors import crash_response, error_response, install_error_handlers, validation_message
from laps_agent.gateway.http.schemas import ChatCompletionRequest, CompletionRequest, ErrorBody, GenerateRequest
from laps_agent.gateway.http.state import Gateway
from laps_agent.gateway.http.status import laps_status, readiness
from laps_agent.gateway.metrics import GatewayMetrics
from laps_agent.gateway.prefix import prefix_chain
from laps_agent.gateway.proxy.failures import GatewayError, UpstreamStatus
from laps_agent.gateway.proxy.load import LoadTracker
from laps_agent.gateway.proxy.payload import PDPayload, parse_body
from laps_agent.gateway.proxy.pd import PDProxy, ProxyCall
from laps_agent.gateway.proxy.relay import HangupGuard, RelayResponse
from laps_agent.gateway.proxy.replies import Reply, StreamReply
from laps_agent.serving.drain import Drain, DrainGuard, refusal_body
from laps_agent.serving.request_id import SCOPE_KEY, shown, tagged

log = logging.getLogger(__name__)
_ERROR_STATUSES = (400, 401, 404, 408, 413, 415, 429, 502, 503, 504)


def create_app(config: GatewayConfig, discovery: Discovery, estimator: TokenEstimator,
               allocator: Callable[[Gateway], Any] | None = None,
               planner: Callable[[Gateway], Any] | None = None) -> FastAPI:
    """`allocator(gateway)` builds a component with start()/stop()/status() that moves pods
    between the groups (`laps local`'s allocation loop; on Kubernetes the operator does it);
    `planner(gateway)` one that sizes the pools (`laps local --autoscale`)."""
    metrics = GatewayMetrics()
    tracker = LoadTracker(metrics, config.proxy)
    gateway = Gateway(config, discovery, estimator, metrics, tracker,
                      PDProxy(config, discovery, tracker, metrics), drain=Drain(config.drain_grace_s))
    if allocator is not None:
        gateway.allocator = allocator(gateway)
    if planner is not None:
        gateway.planner = planner(gateway)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await discovery.start()
        await gateway.proxy.start()
        loops = [loop for loop in (gateway.allocator, gateway.planner) if loop is not None]
        for loop in loops:
            await loop.start()
        try:
            yield
        finally:
            for loop in loops:
                await loop.stop()
            await gateway.proxy.aclose()
            await discovery.stop()

    # No trailing-slash redirects: GatewayApp serves `/path/` as `/path` instead (see there).
    app = GatewayApp(title="laps gateway", version="0.1.0", lifespan=lifespan, redirect_slashes=False)
    install_error_handlers(app)
    auth = install_auth(app, config, metrics, error_response)   # inside the drain guard: see auth.py
    app.add_middleware(DrainGuard, drain=gateway.drain, who="gateway")
    app.state.gateway = gateway

    async def serve(request: Request, model: type[BaseModel], kind: str) -> Response:
        deadline = RequestDeadline(config.request_deadline_s, metrics)
        try:
            return deadline.bound(await deadline.run(_serve(gateway, request, model, kind)))
        except GatewayError as exc:
            metrics.errors.labels(exc.reason).inc()
            _log_failure(request, exc.status, exc.message, exc.busy)
            return error_response(exc.status, exc.message, retry_after=exc.retry_after,
                                  no_retry=exc.no_retry, kind=exc.kind)
        except UpstreamStatus as exc:   # its body is JSON whatever the engine sent (failures.py)
            metrics.errors.labels("upstream_status").inc()
            _log_failure(request, exc.status, f"{exc.who} answered it")
            return Response(exc.body, status_code=exc.status, media_type="application/json")
        except Exception as exc:   # noqa: BLE001 - a bug: still an OpenAI-shaped 500 (errors.py)
            metrics.errors.labels("internal_error").inc()
            return crash_response(exc, shown(request.scope))

    def post(path: str, model: type[BaseModel], kind: str) -> None:
        async def endpoint(request: Request) -> Response:
            return await serve(request, model, kind)

        endpoint.__name__ = kind
        # The route publishes the endpoint (OpenAPI); GatewayApp serves it with `work`, behind
        # the same guards as the app's middleware.
        app.post(path, openapi_extra=_body_schema(model, components),
                 responses=_error_docs())(endpoint)
        app.work[path] = DrainGuard(auth(_Plain(serve, model, kind)), drain=gateway.drain, who="gateway")

    components: dict = {}
    post("/v1/completions", CompletionRequest, "completion")
    post("/v1/chat/completions", ChatCompletionRequest, "chat")
    post("/generate", GenerateRequest, "generate")

    card = {"id": config.served_model_name, "object": "model", "created": 0, "owned_by": "laps"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}", responses={404: {"model": ErrorBody}})
    async def model(model_id: str) -> Response:
        """OpenAI's retrieve-model (the `openai` client's models.retrieve); ids may hold '/'."""
        if model_id != config.served_model_name:
            return error_response(404, f"model {model_id!r} is not served here; this gateway "
                                       f"serves {config.served_model_name!r}")
        return JSONResponse(card)

    @app.get("/health", responses={503: {"description": "not ready: no usable prefill or decode "
                                                          "pod, or draining (shutting down)"}})
    async def health() -> Response:
        """Readiness: whether this gateway can route a request at all (never while draining)."""
        if gateway.drain.draining:
            return JSONResponse({"status": "draining", "ready": False, "reason": "draining: "
                                 f"{gateway.drain.in_flight} request(s) in flight",
                                 **refusal_body("gateway")}, status_code=503)
        ready, reason = readiness(discovery.membership(), gateway.tracker.loads())
        if ready:
            return JSONResponse({"status": "ok", "ready": True})
        return JSONResponse({"status": "unavailable", "ready": False, "reason": reason},
                            status_code=503)

    @app.get("/live")
    async def live() -> dict:
        """Liveness: the process serves HTTP (whatever its pods do)."""
        return {"status": "ok"}

    @app.get("/laps_status")
    async def status() -> dict:
        return laps_status(gateway)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # HEAD on the probe paths, as GET (uvicorn sends no body): HTTP load balancers and uptime
    # checks probe with HEAD, and a 405 reads as "down".
    for path, endpoint in (("/health", health), ("/live", live), ("/v1/models", models)):
        app.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)
    _install_openapi(app, components)
    return app


async def _serve(gateway: Gateway, request: Request, model: type[BaseModel], kind: str) -> Response:
    config = gateway.config
    raw = await read_body(request, config.max_body_bytes, config.body_idle_timeout_s)
    body = parse_body(raw)
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        # 400, as OpenAI and SGLang answer invalid fields (FastAPI's 422 reached the `openai`
        # client as UnprocessableEntityError, not the BadRequestError callers catch).
        raise GatewayError(400, "invalid_request",
                           validation_message(exc.errors(include_url=False))) from None
    requested = getattr(parsed, "model", None)
    if requested is not None and requested != config.served_model_name:
        raise GatewayError(404, "unknown_model", f"model {requested!r} is not served here; "
                           f"this gateway serves {config.served_model_name!r}")
    estimator = gateway.estimator
    try:
        if estimator.exact:  # tokenizing a long prompt takes milliseconds: not on the event loop
            count = await asyncio.to_thread(estimator.count, body, kind)
        else:
            count = estimator.count(body, kind)
    except (TypeError, UnicodeError) as exc:  # the tokenizer cannot encode it: nor can the engine
        raise GatewayError(400, "invalid_request", f"the tokenizer cannot encode the prompt: {exc}") from None
    except ValueError as exc:  # an estimate is advisory: never fail a valid request over it
        log.warning("token estimate failed (%s); using the body size", exc)
        count = PromptCount(len(raw) // 4, exact=False)
    # Before admission: a prompt no engine takes gets their 400, never a retryable 429 (context.py).
    # Only an exact count can refuse: the engines' limit (a walk over the pods) is read for it alone.
    if count.exact:
        refuse_over_context(count, engines_limit(gateway.discovery.membership(),
                                                 gateway.proxy.engine_loads.max_prompt_tokens))
    tokens = count.tokens
    # The prompt's block chain, for cache affinity (gateway/prefix.py): hashes, no tokenizer.
    chain = prefix_chain(body, kind, tokens) if gateway.proxy.affinity.record is not None else None
    call = ProxyCall(path=request.scope["path"], body=PDPayload(raw, body), stream=bool(parsed.stream),
                     tokens=tokens, output_tokens=getattr(parsed, "max_tokens", None) or 0,
                     request_id=request.scope[SCOPE_KEY], prefix=chain)
    reply = None
    async with HangupGuard(request.receive) as guard:  # a hang-up cancels both upstream calls
        reply = await gateway.proxy.forward(call)
    if guard.gone:
        if isinstance(reply, StreamReply):
            await reply.close()
        raise client_gone()
    if isinstance(reply, Reply):
        return Response(reply.body, status_code=reply.status, media_type=reply.content_type)
    # The series is made when a client stalls, not before: a zero series per reason that never
    # happened would crowd the errors panel.
    return RelayResponse(reply, stall_s=config.client_stall_s,
                         stalled=lambda: gateway.metrics.errors.labels("client_stalled").inc())


def _log_failure(request: Request, status: int, message: str, busy: bool = False) -> None:
    """One line per failed request, naming its id (request_id.py): a warning for the gateway's or
    the pods' failures (5xx), debug for refusals of the request itself (4xx: a client's mistake,
    or 429 load shedding) and for the pods' (`busy`: a 503 of full queues, draining pods or none
    left to try), which an overload also brings by the thousand."""
    log.log(logging.WARNING if status >= 500 and not busy else logging.DEBUG,
            "request %s failed with %d: %s", shown(request.scope), status, message)


class GatewayApp(FastAPI):
    """FastAPI, with the work routes (the three POST endpoints) served ahead of its own layers:
    its per-request machinery (middleware stack, exception and exit-stack layers, dependency
    solving, route matching, its telemetry check) measured ~0.15 ms of CPU per request, a
    quarter of the gateway's cost for a 1 KB request. `work` maps each such path to its ASGI
    handler; `serve` answers an unexpected exception itself (errors.py), as the app's error
    middleware would.

    A path with a trailing slash is served as the path without it. FastAPI redirected it (307
    to `http://<Host>/path`): wrong behind a TLS terminator or a proxy, and most clients do
    not send a POST's body again after a redirect. FastAPI-based servers (SGLang, vLLM) have
    taught clients that `/v1/chat/completions/` works, so it is served rather than refused."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.work: dict[str, Callable] = {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            # Here, ahead of everything that may answer (routes, guards, error handlers), so
            # that every response carries the request's id (request_id.py).
            send = tagged(scope, send)
            path = scope["path"]
            if path[-1:] == "/" and path != "/":
                scope = {**scope, "path": path.rstrip("/") or "/"}
            if scope["method"] == "POST":
                handler = self.work.get(scope["path"])
                if handler is not None:
                    scope["app"] = self
                    await handler(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)


class _Plain:
    """One work route as a bare ASGI app."""

    def __init__(self, serve: Callable, model: type[BaseModel], kind: str) -> None:
        self._serve, self._model, self._kind = serve, model, kind

    async def __call__(self, scope, receive, send) -> None:
        response = await self._serve(Request(scope, receive), self._model, self._kind)
        await response(scope, receive, send)


def _body_schema(model: type[BaseModel], components: dict) -> dict:
    """The body is read by hand (for the size limit and raw pass-through), so its schema is
    published here; nested models go to components, where OpenAPI `$ref`s point."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _install_openapi(app: FastAPI, components: dict) -> None:
    original = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = original()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
        return app.openapi_schema

    app.openapi = openapi


def _error_docs() -> dict:
    return {status: {"model": ErrorBody} for status in _ERROR_STATUSES}
