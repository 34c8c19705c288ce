"""Prompt-token estimate of a request body, used by the gateway to pick short or long prefill pods.

With the model's tokenizer the count is what the engine will see (the chat template applied to
chat messages, text parts joined the way the engine joins them, no extra special tokens); token
ids count exactly in every mode; batched prompts count the sum (the prefill work the pod gets).
Without a tokenizer a heuristic counts what byte-level BPE tokenizers split on: a digit 1 token,
an ASCII word ~1.2, a punctuation mark ~0.5, a line break with its indentation ~1.5, any other
non-ASCII character 1, plus per-message and per-request overheads for a chat template's role
markers. A text longer than EXACT_CHARS (~2,000 tokens or more, past any usual threshold) is
counted on SAMPLE_WINDOWS evenly spaced windows of WINDOW_CHARS (the first and the last
included), scaled by its length. The weights were fitted with `python -m scripts.estimate_report`;
why these classes, the heuristic's and the sample's errors: docs/design/length-estimate.md.

`count` also says whether the count is *exact*: one prompt, counted as the engine counts it
(token ids; with the tokenizer, a text, or a chat whose template rendered). The engine may count
a text one or two tokens more (the special tokens its tokenizer adds: a Llama's BOS), never
fewer, so an exact count over the engines' limit is a prompt they refuse (gateway/http/context.py);
a heuristic one only guesses at that and is never used to refuse.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol, Sequence

from laps_agent.gateway.proxy.failures import GatewayError
from laps_agent.modelio.prompt_rules import template_role

# Heuristic weights, fitted by estimate_report (see the module docstring).
TOKENS_PER_WORD = 1.2
TOKENS_PER_PUNCTUATION = 0.5
TOKENS_PER_LINE_BREAK = 1.5
TOKENS_PER_OTHER_CHAR = 1.0
# Longer texts are counted on a sample (see the module docstring).
EXACT_CHARS = 8192
SAMPLE_WINDOWS = 64
WINDOW_CHARS = 128


# What the heuristic counts, defined as regular expressions over the text: digits [0-9], words
# [A-Za-z]+, punctuation [!-/:-@\[-`{-~], line breaks \n[ \t]* (one per "\n": the indentation
# after it belongs to it) and other characters [^\x00-\x7f]. Running those is ~1.4 ms for a
# 40 KB prompt, the gateway's largest cost per request; so the counts are taken on the text's
# UTF-8 bytes instead, mapped by bytes.translate to one class letter per byte and counted by
# bytes.count (~0.15 ms, the same numbers: tests/unit/gateway_policy/test_estimate.py).
# A non-ASCII character is counted by its first byte (>= 0xC0; continuation bytes are 0x80-0xBF).
def _byte_class(b: int) -> int:
    if b >= 0xC0:
        return ord("u")
    if 0x30 <= b <= 0x39:
        return ord("d")
    if 0x21 <= b <= 0x2F or 0x3A <= b <= 0x40 or 0x5B <= b <= 0x60 or 0x7B <= b <= 0x7E:
        return ord("p")
    return ord("n") if b == 0x0A else ord(" ")


_CLASSES = bytes(_byte_class(b) for b in range(256))
# Words are runs of ASCII letters: in a letters-or-blank map, a word starts at " a" (or at 0).
_LETTERS = bytes(ord("a") if 0x41 <= b <= 0x5A or 0x61 <= b <= 0x7A else ord(" ") for b in range(256))
# Chat-template tokens: per message (<|im_start|>, role, newline, <|im_end|>, newline) and per
# request (the generation prompt). Templates that inject a default system prompt add more; the
# heuristic cannot know them, and the error stays small next to a 256-token threshold.
CHAT_TOKENS_PER_MESSAGE = 5
CHAT_TOKENS_PER_REQUEST = 3

KINDS = ("chat", "completion", "generate")
MODES = ("auto", "heuristic", "chars4")


def chars4_tokens(text: str) -> int:
    """The reference router's length estimate: one token per four characters."""
    return max(1, len(text) // 4) if text else 0


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...


class PromptCount(NamedTuple):
    tokens: int
    exact: bool   # at most what the engine counts, and short of it by its special tokens alone


class EstimateError(ValueError):
    """The body lacks the field that holds the prompt, or it has the wrong shape."""


def heuristic_tokens(text: str) -> int:
    """Token count of `text` without a tokenizer (see the module docstring)."""
    if not text:
        return 0
    n = len(text)
    if n <= EXACT_CHARS:
        return max(1, round(_heuristic_count(text)))
    # Windows every `step` characters from the start, and the last at the very end; the slices
    # are made by map in C (a comprehension computing each window took a third of the estimate).
    step = (n - WINDOW_CHARS) // (SAMPLE_WINDOWS - 1)
    last = (SAMPLE_WINDOWS - 2) * step
    sample = "".join(map(text.__getitem__, map(slice, range(0, last + 1, step),
                                              range(WINDOW_CHARS, last + WINDOW_CHARS + 1, step))))
    sample += text[n - WINDOW_CHARS:]
    return max(1, round(_heuristic_count(sample) * n / len(sample)))


def _heuristic_count(text: str) -> float:
    data = text.encode("utf-8", "surrogatepass")
    classes, letters = data.translate(_CLASSES), data.translate(_LETTERS)
    words = letters.count(b" a") + (letters[0] == 0x61)
    other = classes.count(b"u") if len(data) != len(text) else 0  # same length: all ASCII
    return (classes.count(b"d") + TOKENS_PER_WORD * words
            + TOKENS_PER_PUNCTUATION * classes.count(b"p")
            + TOKENS_PER_LINE_BREAK * classes.count(b"n")
            + TOKENS_PER_OTHER_CHAR * other)


def message_text(content: Any) -> str:
    """A chat message's text: a string, or OpenAI content parts whose text parts are joined
    (as the engine does); anything else counts as empty."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


class TokenEstimator:
    """mode "auto": the tokenizer when there is one, else the heuristic; "heuristic"; "chars4"."""

    def __init__(self, tokenizer: TokenizerLike | None, mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"estimator mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.tokenizer = tokenizer if mode == "auto" else None

    @property
    def exact(self) -> bool:
        """Whether estimates tokenize: then the gateway runs them on a worker thread."""
        return self.tokenizer is not None

    def _encode(self, text: str) -> int:
        # The laps tokenizer can encode without holding the GIL, so a worker thread running
        # this leaves the gateway's event loop free (other tokenizers: plain encode).
        encode = getattr(self.tokenizer, "encode_unlocked", self.tokenizer.encode)
        return len(encode(text, add_special_tokens=False))

    def text_tokens(self, text: str) -> int:
        if self.mode == "chars4":
            return chars4_tokens(text)
        if self.tokenizer is None:
            return heuristic_tokens(text)
        return self._encode(text)

    def estimate(self, body: dict, kind: str) -> int:
        """Prompt tokens of a request body; kind is "chat" | "completion" | "generate"."""
        return self.count(body, kind).tokens

    def count(self, body: dict, kind: str) -> PromptCount:
        """`estimate`, and whether it is exact (see the module docstring)."""
        if not isinstance(body, dict):
            raise EstimateError("request body must be a JSON object")
        if kind == "chat":
            return self._chat(body.get("messages"))
        if kind == "completion":
            if "prompt" not in body:
                raise EstimateError("completion request needs `prompt`")
            return self._single(body["prompt"], "prompt")
        if kind == "generate":
            if body.get("input_ids") is not None:
                return self._single(body["input_ids"], "input_ids")
            if body.get("text") is not None:
                return self._single(body["text"], "text")
            raise EstimateError("generate request needs `text` or `input_ids`")
        raise EstimateError(f"unknown request kind {kind!r}; expected one of {', '.join(KINDS)}")

    def _single(self, prompt: Any, field: str) -> PromptCount:
        # A batch's sum is no prompt's length: only a single prompt's count can be exact.
        exact = _is_token_ids(prompt) or (isinstance(prompt, str) and self.tokenizer is not None)
        return PromptCount(self._prompt(prompt, field), exact)

    def _prompt(self, prompt: Any, field: str) -> int:
        if isinstance(prompt, str):
            return self.text_tokens(prompt)
        if _is_token_ids(prompt):
            self._check_ids(prompt, field)
            return len(prompt)
        if isinstance(prompt, list) and all(isinstance(p, str) or _is_token_ids(p) for p in prompt):
            return sum(self._prompt(p, field) for p in prompt)
        raise EstimateError(f"`{field}` must be a string, a list of strings, a list of token ids "
                            f"or a list of such lists")

    def _check_ids(self, ids: list[int], field: str) -> None:
        """A token id outside the vocabulary is the client's error, answered here: SGLang 0.5.23
        does not check them, and one such id crashed its prefill server's scheduler (an
        embedding IndexError), taking the pod down, and the gateway's retry then the next
        pod. Negative ids are always wrong; the upper bound needs the model's tokenizer."""
        vocab = getattr(self.tokenizer, "vocab_size", None)
        if ids and (min(ids) < 0 or (vocab is not None and max(ids) >= vocab)):
            bound = f"0..{vocab - 1}" if vocab is not None else "0 or more"
            raise GatewayError(400, "invalid_request", f"`{field}` holds token id "
                               f"{min(ids) if min(ids) < 0 else max(ids)}; token ids must be {bound}")

    def _chat(self, messages: Any) -> PromptCount:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise EstimateError("chat request needs `messages`, a list of objects")
        # The messages as the engine hands them to the template (engine/chat_messages.py).
        clean = [{"role": template_role(str(m.get("role", "user"))),
                  "content": message_text(m.get("content"))} for m in messages]
        if self.mode == "chars4":
            return PromptCount(chars4_tokens("".join(m["content"] for m in clean)), False)
        if self.tokenizer is not None:
            try:
                return PromptCount(self._encode(self.tokenizer.apply_chat_template(clean)), True)
            except ValueError:  # no template, or it refused these messages: count the parts
                pass
        return PromptCount(self._chat_heuristic(clean), False)

    def _chat_heuristic(self, clean: Sequence[dict]) -> int:
        return CHAT_TOKENS_PER_REQUEST + sum(
            CHAT_TOKENS_PER_MESSAGE + self.text_tokens(m["content"]) for m in clean)
