"""An OpenAI chat request's `messages`, checked and reduced to what a chat template renders:
`{"role", "content": str}`. Every bad message becomes an ApiError naming it."""
from __future__ import annotations

from typing import Any

from laps_agent.engine.http.api_error import ApiError
from laps_agent.modelio.prompt_rules import template_role

_TOOLS_REFUSED = ("tool calls are not supported by this engine (nor is `tools`): leave tool calls "
                  "and their results out of the history, or serve the model with the SGLang backend")


def _text_parts(parts: list, where: str) -> str:
    """The text of a message's content parts. Any other part (image_url, input_audio, file) is
    refused: this text-only engine answering without it would answer another question."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "text":
            raise ApiError(400, f"{where}[{j}].text must be a string")
        else:
            shown = f"type {kind!r}" if isinstance(kind, str) else repr(part)[:80]
            raise ApiError(400, f"{where}[{j}] ({shown}) is not supported: this model takes "
                                f"text parts only ({{\"type\": \"text\", \"text\": ...}})")
    return "".join(texts)


def _tool_use(m: dict) -> str | None:
    """What in a message belongs to tool calling, if anything. A tool-using client sends its
    history back: an assistant turn with `tool_calls` (and `content: null`), then `tool`
    results. Refused as such, not as a bad `content`: the chat template renders no tool calls,
    so the model would answer a conversation other than the client's."""
    if m.get("tool_calls"):
        return "a message with `tool_calls`"
    if m.get("function_call"):
        return "a message with `function_call`"
    if m["role"] in ("tool", "function"):
        return f"a tool result (role {m['role']!r})"
    return None


def clean_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string `role`")
        tool = _tool_use(m)
        if tool is not None:
            raise ApiError(400, f"messages[{i}] is {tool}: {_TOOLS_REFUSED}")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = _text_parts(content, f"messages[{i}].content")
        elif content is None and m["role"] == "assistant":
            content = ""  # OpenAI's API allows an assistant turn without content: it said nothing
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string or text parts")
        clean.append({"role": template_role(m["role"]), "content": content})
    return clean
