"""A Tokenizer from a GGUF file's metadata (byte-level BPE, as llama.cpp's converter writes it).

No torch import here: the gateway counts prompt tokens with this module.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from laps_agent.modelio.gguf_metadata import GGUFFormatError, read_gguf_metadata
from laps_agent.modelio.tokenizer_base import Tokenizer, TokenizerError

log = logging.getLogger(__name__)

# GGUF token_type values (llama.cpp's llama_token_type).
_GGUF_CONTROL = 3
_GGUF_USER_DEFINED = 4


def read_gguf_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of the GGUF file at `path` (its tokenizer.* metadata alone is read)."""
    try:
        metadata = read_gguf_metadata(path, wanted=tokenizer_key)
    except GGUFFormatError as err:
        raise TokenizerError(str(err)) from None
    return tokenizer_from_gguf(metadata)


# Llama 3's split pattern; Qwen2's is the same with single digits.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _gguf_pre_tokenizer(pre: str) -> Any:
    """The HF pre-tokenizer matching llama.cpp's `tokenizer.ggml.pre` name."""
    if pre in ("smollm", "starcoder", "refact"):
        # Every digit on its own, then GPT-2's byte-level regex split.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("llama3", "llama-bpe", "qwen2"):
        pattern = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}") if pre == "qwen2" else _LLAMA3_SPLIT
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre in ("default", "gpt2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raise TokenizerError(f"GGUF pre-tokenizer {pre!r} is not supported "
                         "(smollm, starcoder, refact, llama3, llama-bpe, qwen2, gpt2, default)")


def tokenizer_key(key: str) -> bool:
    """The GGUF metadata keys tokenizer_from_gguf reads."""
    return key.startswith("tokenizer.")


def tokenizer_from_gguf(metadata: Mapping[str, Any]) -> Tokenizer:
    """From a GGUF file's metadata (gguf_metadata.read_gguf_metadata; tokenizer_key's suffice)."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
    tokens, merges, types = _checked_vocabulary(metadata)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    try:
        bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                         fuse_unk=False, byte_fallback=False)
    except Exception as err:  # noqa: BLE001 - tokenizers raises its own bare Exception
        raise TokenizerError(f"GGUF tokenizer.ggml.merges do not fit tokenizer.ggml.tokens: {err}") from None
    backend = HFTokenizer(bpe)
    backend.pre_tokenizer = _gguf_pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"))
    backend.decoder = decoders.ByteLevel()
    specials = [AddedToken(tok, special=True, normalized=False)
                for tok, t in zip(tokens, types) if t in (_GGUF_CONTROL, _GGUF_USER_DEFINED)]
    backend.add_special_tokens(specials)

    bos, eos = (_token_id(metadata, f"tokenizer.ggml.{name}_token_id", len(tokens)) for name in ("bos", "eos"))
    try:
        eot = _token_id(metadata, "tokenizer.ggml.eot_token_id", len(tokens))
    except TokenizerError as err:  # an extra stop token only: llama.cpp, too, warns and goes on
        log.warning("%s: ignored", err)
        eot = None
    if bos is not None and metadata.get("tokenizer.ggml.add_bos_token", False):
        bos_text = tokens[bos]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos_text} $A", pair=f"{bos_text} $A {bos_text} $B", special_tokens=[(bos_text, bos)])
    eos_ids = {i for i in (eos, eot) if i is not None}
    return Tokenizer(
        backend, chat_template=metadata.get("tokenizer.chat_template"),
        eos_token_ids=frozenset(eos_ids), bos_token_id=bos,
        bos_token=tokens[bos] if bos is not None else None,
        eos_token=tokens[eos] if eos is not None else None)


def _checked_vocabulary(metadata: Mapping[str, Any]) -> tuple[list[str], list[str], list[int]]:
    """tokens, merges and token types, or a TokenizerError naming the key that is missing or of
    the wrong shape (a hand-made or cut GGUF otherwise failed deep inside, as a TypeError)."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise TokenizerError("GGUF tokenizer.ggml.tokens is missing or not a list of strings")
    merges = metadata.get("tokenizer.ggml.merges", [])
    if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m for m in merges):
        raise TokenizerError("GGUF tokenizer.ggml.merges is not a list of 'left right' strings")
    types = metadata.get("tokenizer.ggml.token_type", [1] * len(tokens))
    if not isinstance(types, list) or len(types) != len(tokens):
        raise TokenizerError(f"GGUF tokenizer.ggml.token_type does not give one type for each of the "
                             f"{len(tokens)} tokens")
    return tokens, merges, types


def _token_id(metadata: Mapping[str, Any], key: str, vocab_size: int) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise TokenizerError(f"GGUF {key} is {value!r}, not a token id of the {vocab_size}-token vocabulary")
    return value
