"""A stub engine behind stock SGLang's routes (the gateway's sglang backend): no `/get_load`, its
load at `/v1/loads`, its context length at `/v1/models`, its server arguments at `/server_info`
and `/get_server_info`, each in the shape the installed SGLang (0.5.23) serves; generation is
the wrapped StubEngine's. The shapes are copied from SGLang's source, cited at each."""
from __future__ import annotations

import time

from tests.support.stub_engine import StubEngine, _json


class StubSGLang:
    """ASGI app: SGLang's informational routes, the rest served by `engine`."""

    def __init__(self, engine: StubEngine, *, context_len: int,
                 server_args: dict | None = None) -> None:
        self.engine, self.context_len = engine, context_len
        self.server_args = {"allow_auto_truncate": False, "speculative_algorithm": None, **(server_args or {})}
        self.asked: dict[str, int] = {}   # informational path -> times asked
        # Informational path -> (status, raw body) answered instead of SGLang's: a server that
        # is not quite SGLang, or an SGLang going away (a failed load poll).
        self.answers: dict[str, tuple[int, bytes]] = {}

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or scope["method"] != "GET" or path not in _ROUTES:
            return await self.engine(scope, receive, send)
        self.asked[path] = self.asked.get(path, 0) + 1
        if path in self.answers:
            status, body = self.answers[path]
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
            return await send({"type": "http.response.body", "body": body})
        if path == "/get_load":   # SGLang has no such route: FastAPI's 404
            return await _json(send, 404, {"detail": "Not Found"})
        return await _json(send, 200, getattr(self, _ROUTES[path])())

    def _loads(self) -> dict:
        # sglang/srt/entrypoints/v1_loads.py get_loads, with include=core: each rank's
        # LoadSnapshot.to_dict({"core"}) (sglang/srt/managers/load_snapshot.py).
        rank = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0,
                "num_waiting_uncached_tokens": 0, "num_used_tokens": 0, "num_total_tokens": 0,
                "num_active_tokens": 0, "num_prealloc_ready_tokens": 0, "max_total_num_tokens": 100000,
                "max_running_requests": 64, "token_usage": 0.0, "gen_throughput": 0.0,
                "cache_hit_rate": 0.0, "utilization": 0.0, "total_prefill_uncached_tokens": 0,
                "total_prefill_busy_us": 0, "decode_moments": None}
        return {"timestamp": "2026-01-01T00:00:00+00:00", "version": "0.5.23", "accelerator": None,
                "num_accelerators": 1, "loads": [rank]}

    def _models(self) -> dict:
        # sglang/srt/entrypoints/http_server.py available_models: ModelList of ModelCard
        # (sglang/srt/entrypoints/openai/protocol.py), max_model_len = model_config.context_len.
        model = self.engine.model
        return {"object": "list", "data": [{
            "id": model, "object": "model", "created": int(time.time()), "owned_by": "sglang",
            "root": model, "parent": None, "max_model_len": self.context_len}]}

    def _server_info(self) -> dict:
        # sglang/srt/entrypoints/http_server.py server_info: the server arguments, flat
        # (ServerArgs.resolved_dict), plus scheduler state; a few of its many keys.
        role = self.engine.role
        return {"model_path": self.engine.model, "context_length": None, "disaggregation_mode": role,
                "disaggregation_bootstrap_port": self.engine.bootstrap_port or 8998,
                "max_total_num_tokens": 100000, "internal_states": [{}], "version": "0.5.23",
                **self.server_args}


_ROUTES = {"/get_load": "", "/v1/loads": "_loads", "/v1/models": "_models",
           "/server_info": "_server_info", "/get_server_info": "_server_info"}
