"""Prompts from a JSONL file (`prompt_tokens: {distribution: jsonl, path: ..., order: ...}`).

Each line is `{"prompt": "...", "output_tokens": N?}` or `{"messages": [...], "output_tokens": N?}`.
A line's prompt length is the token count of what the load generator sends for it: with a
tokenizer, the encoded prompt (completions) or the encoded chat-templated messages (chat; a
`prompt` line becomes one user message, a `messages` line sent to completions is templated
first); without one, the gateway's heuristic estimate. A line's `output_tokens`, when present,
replaces the phase's output_tokens draw.

`order: sequential` (default) takes the lines in file order and starts again at the top when
a phase needs more; `order: sample` draws lines uniformly with replacement from the phase's
seeded generator.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from laps_agent.gateway.estimate import heuristic_tokens
from laps_agent.lab.workload.spec import WorkloadError


@dataclass(frozen=True)
class JsonlLine:
    number: int                       # 1-based line number in the file
    prompt: str | None
    messages: list[dict] | None
    output_tokens: int | None

    def completion_text(self, tokenizer: Any | None) -> str:
        if self.prompt is not None:
            return self.prompt
        if tokenizer is not None:
            return tokenizer.apply_chat_template(self.messages)
        return "\n".join(str(m.get("content") or "") for m in self.messages)

    def chat_messages(self) -> list[dict]:
        return self.messages if self.messages is not None else [{"role": "user", "content": self.prompt}]


@dataclass(frozen=True)
class JsonlSource:
    path: Path
    lines: list[JsonlLine]
    prompt_tokens: np.ndarray         # per line, for the workload's api


def _parse_line(raw: str, number: int, name: str) -> JsonlLine:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{name}:{number}: not valid JSON: {exc.msg}") from None
    if not isinstance(obj, dict) or ("prompt" in obj) == ("messages" in obj):
        raise WorkloadError(f"{name}:{number}: expected an object with exactly one of 'prompt' or 'messages'")
    unknown = set(obj) - {"prompt", "messages", "output_tokens"}
    if unknown:
        raise WorkloadError(f"{name}:{number}: unknown key(s) {', '.join(sorted(unknown))}")
    prompt, messages, out = obj.get("prompt"), obj.get("messages"), obj.get("output_tokens")
    if prompt is not None and not (isinstance(prompt, str) and prompt):
        # An empty prompt is refused by every server: every request of that line would fail.
        raise WorkloadError(f"{name}:{number}: prompt: must be a non-empty string")
    if messages is not None and not (isinstance(messages, list) and messages
                                     and all(isinstance(m, dict) and "role" in m for m in messages)):
        raise WorkloadError(f"{name}:{number}: messages: must be a non-empty list of objects with a 'role'")
    if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
        raise WorkloadError(f"{name}:{number}: output_tokens: must be an integer >= 1")
    return JsonlLine(number, prompt, messages, out)


def _count(line: JsonlLine, api: str, tokenizer: Any | None) -> int:
    if tokenizer is None:
        if api == "chat":
            return sum(heuristic_tokens(str(m.get("content") or "")) for m in line.chat_messages())
        return heuristic_tokens(line.completion_text(None))
    if api == "chat":
        text = tokenizer.apply_chat_template(line.chat_messages())
    else:
        text = line.completion_text(tokenizer)
    return max(1, len(tokenizer.encode(text)))


def load_jsonl(path: Path, api: str, tokenizer: Any | None, origin: str = "workload") -> JsonlSource:
    try:
        raw_lines = path.read_text().splitlines()
    except OSError as exc:
        raise WorkloadError(f"{origin}: jsonl file {path}: {exc.strerror or exc}") from None
    lines = [_parse_line(raw, i + 1, path.name) for i, raw in enumerate(raw_lines) if raw.strip()]
    if not lines:
        raise WorkloadError(f"{origin}: jsonl file {path} has no lines")
    counts = np.fromiter((_count(line, api, tokenizer) for line in lines), dtype=np.int64, count=len(lines))
    return JsonlSource(path, lines, counts)


def pick(source: JsonlSource, order: str, start: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Line indices for n requests; `start` continues a sequential walk across phases."""
    if order == "sample":
        return rng.integers(0, len(source.lines), size=n)
    return (start + np.arange(n)) % len(source.lines)
