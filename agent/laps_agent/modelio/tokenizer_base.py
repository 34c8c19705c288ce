"""The Tokenizer class and its errors: a Hugging Face `tokenizers` backend, the special tokens and
the chat template as Hugging Face renders it. Where the files come from is tokenizer.py's (an HF
directory, and `load_tokenizer` for either kind) and tokenizer_gguf.py's (a GGUF file), both
built on this module.

No torch import here: the gateway counts prompt tokens with this module.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Sequence

from jinja2.exceptions import TemplateError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer


class TokenizerError(ValueError):
    """The tokenizer files are missing or describe something unsupported."""


class ChatTemplateError(ValueError):
    """The chat template refused the messages (its raise_exception) or is missing."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, &, ' and non-ASCII for HTML ("\u003cb\u003e"): a template
    # passing a message or a tool through it would render another prompt than the model was
    # trained on. Hugging Face's is json.dumps, unescaped.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlock(Extension):
    """transformers' {% generation %}...{% endgeneration %}, which marks an assistant's tokens
    for training masks: a prompt renders its body as it is."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _compile_chat_template(source: str):
    """The template as Hugging Face's apply_chat_template compiles it: its environment (trimmed
    blocks, {% break %}/{% continue %}, {% generation %}), its tojson and its globals (raise_exception,
    strftime_now: Llama 3.x templates write today's date). Templates are written against that
    environment; one using a feature a bare Jinja lacks failed to compile (an unknown tag).
    TokenizerError for a template that does not compile."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except TemplateError as err:
        raise TokenizerError(f"the chat template does not compile: {err}") from None


class Tokenizer:
    def __init__(self, backend: HFTokenizer, *, chat_template: str | None,
                 eos_token_ids: frozenset[int], bos_token_id: int | None,
                 bos_token: str | None = None, eos_token: str | None = None):
        self._backend = backend
        self.chat_template = chat_template
        self.eos_token_ids = eos_token_ids
        self.bos_token_id = bos_token_id
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._template = _compile_chat_template(chat_template) if chat_template else None

    @property
    def backend(self) -> HFTokenizer:
        return self._backend

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """add_special_tokens=True adds what the model's own tokenizer adds (its post-processor,
        e.g. a BOS for Llama 3; nothing for SmolLM2), as Hugging Face does."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_unlocked(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """`encode`, but the GIL is released while the Rust tokenizer runs (`encode` holds it
        throughout; a batch of one does not): for a caller on a worker thread whose event loop
        must go on meanwhile, as the gateway's estimate of a long prompt (~13 ms per 40 KB)."""
        return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ChatTemplateError("this model has no chat template")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise ChatTemplateError(f"message {i} must be an object with a 'role'")
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, KeyError) as err:
            raise ChatTemplateError(f"chat template failed: {err}") from err
