"""Parsing the three request dialects (SGLang /generate, OpenAI completions, OpenAI chat) into
one `ParsedRequest`, and shaping responses. Every bad input becomes an ApiError (4xx + message)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from laps_agent.engine.core.load_report import LAPS_CLASS_HEADER
from laps_agent.engine.core.sampling_params import SamplingError, SamplingParams, is_whole_number
from laps_agent.engine.http.api_error import ApiError
from laps_agent.engine.http.chat_messages import clean_messages
from laps_agent.engine.http.unsupported_fields import (
    OPENAI_BODY,
    SGLANG_GENERATE,
    SGLANG_SAMPLING,
    asks_nothing,
    refuse_unsupported,
)
from laps_agent.policy.classes import CLASSES, LONG, SHORT

DEFAULT_OPENAI_COMPLETION_TOKENS = 16     # OpenAI's documented default for /v1/completions
DEFAULT_CHAT_TOKENS = 256


@dataclass(frozen=True)
class Bootstrap:
    host: str
    port: int
    room: int


@dataclass
class ParsedRequest:
    kind: str                          # "generate" | "completion" | "chat"
    text: str | None
    input_ids: list[int] | None
    params: SamplingParams
    stream: bool
    bootstrap: Bootstrap | None
    rid: str | None = None
    include_usage: bool = False
    model: str | None = None

    @property
    def add_special_tokens(self) -> bool:
        """A text prompt gets what the model's tokenizer adds (a Llama's BOS), as SGLang and vLLM
        encode it: without it a Llama answers a completion worse and counts one token fewer. A
        chat's template already wrote its special tokens."""
        return self.kind != "chat"


def _require_dict(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _bootstrap(body: dict) -> Bootstrap | None:
    keys = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
    present = [k for k in keys if body.get(k) is not None]
    if not present:
        return None
    if len(present) != 3:
        raise ApiError(400, f"PD requests need all of {', '.join(keys)}; got only {', '.join(present)}")
    host, port, room = (body[k] for k in keys)
    if not isinstance(host, str) or not host:
        raise ApiError(400, "bootstrap_host must be a non-empty string")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ApiError(400, f"bootstrap_port must be an integer port, got {port!r}")
    if isinstance(room, bool) or not isinstance(room, int) or room < 0:
        raise ApiError(400, f"bootstrap_room must be a non-negative integer, got {room!r}")
    return Bootstrap(host, port, room)


def gateway_class(value: str | None) -> str | None:
    """The X-LAPS-Class header's value (core/load_report.py), checked (None when the request has
    none)."""
    if value is not None and value not in CLASSES:
        raise ApiError(400, f'{LAPS_CLASS_HEADER} must be "{SHORT}" or "{LONG}", got {value!r}')
    return value


def _params(raw: dict) -> SamplingParams:
    try:
        return SamplingParams.from_dict(raw)
    except SamplingError as exc:
        raise ApiError(400, str(exc)) from None


def _ids(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ApiError(400, f"{name} must be a list of integer token ids")
    return value


def _bool(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{key} must be a boolean, got {value!r}")
    return value


def parse_generate(body: Any) -> ParsedRequest:
    body = _require_dict(body)
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise ApiError(400, "give exactly one of `text` or `input_ids`")
    if text is not None and not isinstance(text, str):
        raise ApiError(400, "`text` must be a string (batched lists are not supported)")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        raise ApiError(400, f"batched input_ids ({len(ids)} prompts in one request) are not supported: "
                            "send one list of token ids per request")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise ApiError(400, "sampling_params must be an object")
    refuse_unsupported(body, SGLANG_GENERATE)
    refuse_unsupported(sp, SGLANG_SAMPLING, "sampling_params.")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ApiError(400, "rid must be a string")
    return ParsedRequest("generate", text, None if ids is None else _ids(ids, "input_ids"), _params(sp),
                         _bool(body, "stream"), _bootstrap(body), rid=rid)


def _openai_params(body: dict, default_max: int) -> SamplingParams:
    if not asks_nothing(body.get("n"), (None, 1)):  # `n: true` too: a bool is no count
        raise ApiError(400, f"only n=1 is supported, got n={body['n']!r}")
    refuse_unsupported(body, OPENAI_BODY)
    raw = {
        "max_new_tokens": _max_tokens(body, default_max),
        "temperature": body.get("temperature"), "top_p": body.get("top_p"), "top_k": body.get("top_k"),
        "stop": body.get("stop"), "seed": body.get("seed"), "stop_token_ids": body.get("stop_token_ids"),
        "ignore_eos": body.get("ignore_eos", False),
    }
    return _params(raw)


def _max_tokens(body: dict, default: int) -> int:
    """max_completion_tokens (OpenAI's newer name) over max_tokens; a null one does not count:
    typed clients send every field, `"max_completion_tokens": null` beside a real max_tokens.
    Checked here so that the error names the field the client sent."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not is_whole_number(value) or value < 1:
            raise ApiError(400, f"{key} must be an integer >= 1, got {value!r}")
        return int(value)
    return default


def _stream_options(body: dict) -> bool:
    """include_usage, checked like `stream`: bool("no") was True, a usage chunk nobody asked for."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise ApiError(400, f"stream_options must be an object, got {opts!r}")
    value = opts.get("include_usage")
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"stream_options.include_usage must be a boolean, got {value!r}")
    # vLLM's and SGLang's usage on every chunk: not implemented (unsupported_fields.py's rule).
    refuse_unsupported(opts, {"continuous_usage_stats": (None, False)}, "stream_options.")
    return bool(value)


def parse_completion(body: Any) -> ParsedRequest:
    body = _require_dict(body)
    prompt = body.get("prompt")
    text = ids = None
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise ApiError(400, f"batched prompts ({len(prompt)} in one request) are not supported: "
                            "send one prompt per request")
    elif isinstance(prompt, list):
        ids = _ids(prompt, "prompt")
    else:
        raise ApiError(400, "prompt must be a string or a list of token ids (one prompt per request)")
    return ParsedRequest("completion", text, ids, _openai_params(body, DEFAULT_OPENAI_COMPLETION_TOKENS),
                         _bool(body, "stream"), _bootstrap(body), include_usage=_stream_options(body),
                         model=body.get("model"))


def parse_chat(body: Any, apply_template) -> ParsedRequest:
    body = _require_dict(body)
    clean = clean_messages(body.get("messages"))
    try:
        text = apply_template(clean)
    except Exception as exc:  # noqa: BLE001 - template errors are the client's messages' fault
        raise ApiError(400, f"chat template failed: {exc}") from None
    return ParsedRequest("chat", text, None, _openai_params(body, DEFAULT_CHAT_TOKENS), _bool(body, "stream"),
                         _bootstrap(body), include_usage=_stream_options(body), model=body.get("model"))


# ---- response shapes -----------------------------------------------------------------------
def usage(prompt: int, completion: int, cached: int = 0) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def openai_finish(reason: str | None) -> str | None:
    return {"prefilled": "length", "abort": "stop", "error": "stop"}.get(reason, reason) if reason else None


def completion_body(rid: str, model: str, text: str, finish: str | None, prompt: int, completion: int,
                    *, chunk: bool = False, chat: bool = False, first: bool = False, with_usage: bool = True,
                    cached: int = 0, created: int | None = None) -> dict:
    """A whole answer, or (chunk) one event of a stream: every event of one stream carries the
    `created` of its first, as OpenAI's do. A chunk of a stream that ends with a usage chunk
    (with_usage) says `"usage": null`, as OpenAI documents."""
    created = int(time.time()) if created is None else created
    if chat:
        if chunk:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish}
        obj = "chat.completion.chunk" if chunk else "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
    if with_usage:
        body["usage"] = None if chunk else usage(prompt, completion, cached)
    return body


def usage_chunk(rid: str, model: str, prompt: int, completion: int, chat: bool, cached: int = 0,
                created: int | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()) if created is None else created,
            "model": model, "choices": [], "usage": usage(prompt, completion, cached)}


def generate_finish(finish: str | None, matched: Any, completion: int) -> dict | None:
    """/generate's meta_info.finish_reason, in SGLang's shapes: a length stop says its length,
    the others what matched (a stop string, a token id, or None)."""
    if not finish:
        return None
    if finish == "length":
        return {"type": "length", "length": completion}
    return {"type": finish, "matched": matched}


def generate_body(rid: str, text: str, output_ids: list[int], finish: str | None, matched: Any,
                  prompt: int, completion: int, e2e: float, extra: dict | None = None, cached: int = 0) -> dict:
    meta = {"id": rid, "finish_reason": generate_finish(finish, matched, completion),
            "prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": cached,
            "e2e_latency": e2e}
    meta.update(extra or {})
    return {"text": text, "output_ids": output_ids, "meta_info": meta}
