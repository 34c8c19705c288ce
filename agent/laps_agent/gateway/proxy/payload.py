"""The body the gateway posts to both engines: the client's own JSON bytes with the PD fields
(`bootstrap_host`, `bootstrap_port`, `bootstrap_room`) spliced in before the closing brace.

Re-encoding the parsed body would cost time in proportion to the prompt (~0.1 ms per 40 KB, and
another parse-sized walk); splicing costs nothing: the client's bytes up to the brace and the
PD fields go upstream one after the other (`PDPayload.pieces`). Only bytes that are a plain
UTF-8 JSON object (first byte `{`, last `}` after whitespace) are spliced; anything else
json.loads accepts (a UTF-16/32 or BOM-prefixed body) is re-encoded, as is a body that carries
its own `bootstrap_*` keys: those are dropped, so the engines see exactly one of each, the
gateway's. A client's own `rid` (SGLang's request id, in /generate and the OpenAI bodies) must
be unique inside each engine, and clients reuse one (a job id, two workers alike): the engines
get it made unique per attempt, `<rid>-<room in hex>`, still naming the client's request in
their logs; a batch's list of rids (SGLang's /generate) gets the suffix on each. Left as it was,
two requests with one rid at once were each refused by one engine of their pair: the other
waited out the KV hand-off and its prefill pod was blamed.

`parse_body` reads it with tokenizer.loads_json_text (a fast parser, json.loads for what that
refuses), so every body gets json.loads' verdict: its dict, its error message, or a lone
surrogate found and named (tokenizer.unencodable_text)."""
from __future__ import annotations

import json
from typing import Any

from laps_agent.gateway.proxy.failures import GatewayError
from laps_agent.modelio.tokenizer import loads_json_text, unencodable_message, unencodable_text

BOOTSTRAP_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
_JSON_WHITESPACE = b" \t\r\n"


class PDPayload:
    """One request's body, ready to take the PD fields of each attempt."""

    __slots__ = ("_head", "_comma", "_rid")

    def __init__(self, raw: bytes, body: dict) -> None:
        """`raw` is the request body as received and `body` what json.loads made of it."""
        # Neither a string nor a list of them: left for the engine to refuse by name.
        rid = body.get("rid")
        self._rid = rid if isinstance(rid, str) or (
            isinstance(rid, list) and rid and all(isinstance(r, str) for r in rid)) else None
        if any(key in body for key in BOOTSTRAP_KEYS) or self._rid is not None:
            body = {k: v for k, v in body.items() if k not in BOOTSTRAP_KEYS and (k != "rid" or self._rid is None)}
            raw = json.dumps(body).encode()
        text = raw.strip(_JSON_WHITESPACE)
        if text[:1] != b"{" or text[-1:] != b"}":
            text = json.dumps(body).encode()
        # The object without its closing brace (a view of the client's bytes: never copied),
        # and a comma if it has members.
        self._head = memoryview(text)[:-1]
        self._comma = b"," if body else b""

    def pieces(self, host: str, port: int | None, room: int) -> tuple[memoryview, bytes]:
        """An attempt's body as the client's bytes and the PD fields after them: the upstream
        client writes both in one call (writev), so a long body is never copied to join them."""
        rid = b""
        if self._rid is not None:
            suffix = f"-{room:x}"
            unique = [r + suffix for r in self._rid] if isinstance(self._rid, list) else self._rid + suffix
            rid = b'"rid":%s,' % json.dumps(unique).encode()
        return self._head, b'%s%s"bootstrap_host":%s,"bootstrap_port":%s,"bootstrap_room":%d}' % (
            self._comma, rid, json.dumps(host).encode(), b"null" if port is None else b"%d" % port, room)


def upstream_headers(cls: str, request_id: bytes) -> bytes:
    """The header lines both engines get with an attempt. X-LAPS-Class: the class the gateway
    chose (engine/api_models.py); a prefill engine counts where the gateway's expected uncached
    length and its own split disagree (laps_engine_class_total), and every engine reports the
    requests it holds per class in /get_load, so that other gateway replicas see them (the decode
    share). X-Request-ID: the request's id (laps_agent/serving/request_id.py), which the engines name in
    their logs; a stock SGLang ignores it. It is deliberately not SGLang's body `rid`: that must
    be unique inside SGLang, and a client-chosen id may repeat (a retry, two clients alike)."""
    return b"x-laps-class: %s\r\nx-request-id: %s\r\n" % (cls.encode(), request_id)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; GatewayError 400 when it is not one (see the module
    docstring)."""
    try:
        body, text = loads_json_text(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(400, "bad_json", f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise GatewayError(400, "bad_json", "request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "bad_json", "request body must be a JSON object")
    where = None if text else unencodable_text(raw, body)
    if where is not None:  # the engines' tokenizer could not encode it either
        raise GatewayError(400, "invalid_request", unencodable_message(where))
    return body
