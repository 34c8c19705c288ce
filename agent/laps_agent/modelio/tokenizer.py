"""Tokenizer for a GGUF file or a Hugging Face model directory, plus its chat template: the class
is tokenizer_base.py's, the GGUF reading tokenizer_gguf.py's, the HF directory's here.

No torch import here: the gateway counts prompt tokens with this module.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic_core import from_json
from tokenizers import Tokenizer as HFTokenizer

from laps_agent.modelio.tokenizer_base import ChatTemplateError, Tokenizer, TokenizerError
from laps_agent.modelio.tokenizer_gguf import read_gguf_tokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Tokenizer of a GGUF file or an HF directory (tokenizer.json + tokenizer_config.json)."""
    path = Path(path)
    if not path.exists():   # said as the engine says it of the same path (ModelLoadError)
        raise TokenizerError(f"{path}: no such file or directory")
    if path.is_file() and path.suffix == ".gguf":
        return read_gguf_tokenizer(path)
    if path.is_dir():
        return tokenizer_from_hf_dir(path)
    raise TokenizerError(f"{path}: expected a .gguf file or a Hugging Face model directory")


def tokenizer_problem(path: str | Path, exc: Exception) -> str:
    """The one line a command prints (and leaves as its exit reason) when `load_tokenizer(path)`
    raised `exc`: the path once, whether or not the error already names it."""
    said = str(exc)
    return f"cannot read a tokenizer: {said}" if said.startswith(str(path)) else (
        f"cannot read a tokenizer from {path}: {said}")


# ---------------------------------------------------------------- HF directory

def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise TokenizerError(f"{path}: invalid JSON: {err}") from err


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _pick_chat_template(tok_cfg: dict, model_dir: Path) -> str | None:
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        by_name = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = by_name.get("default") or next(iter(by_name.values()), None)
    if not template and (model_dir / "chat_template.jinja").exists():
        template = (model_dir / "chat_template.jinja").read_text()
    return template or None


def tokenizer_from_hf_dir(model_dir: Path) -> Tokenizer:
    tok_file = model_dir / "tokenizer.json"
    if not tok_file.exists():
        raise TokenizerError(f"{model_dir}: no tokenizer.json")
    backend = HFTokenizer.from_file(str(tok_file))
    tok_cfg = _read_json(model_dir / "tokenizer_config.json")
    model_cfg = _read_json(model_dir / "config.json")
    gen_cfg = _read_json(model_dir / "generation_config.json")

    bos_token = _token_content(tok_cfg.get("bos_token"))
    eos_token = _token_content(tok_cfg.get("eos_token"))
    eos_ids: set[int] = set()
    for cfg in (model_cfg, gen_cfg):
        value = cfg.get("eos_token_id")
        if isinstance(value, list):
            eos_ids.update(int(v) for v in value)
        elif value is not None:
            eos_ids.add(int(value))
    if eos_token is not None and backend.token_to_id(eos_token) is not None:
        eos_ids.add(backend.token_to_id(eos_token))
    bos_id = model_cfg.get("bos_token_id")
    if bos_id is None and bos_token is not None:
        bos_id = backend.token_to_id(bos_token)
    if bos_token is None and bos_id is not None:
        bos_token = backend.id_to_token(int(bos_id))
    if eos_token is None and eos_ids:
        eos_token = backend.id_to_token(min(eos_ids))
    return Tokenizer(backend, chat_template=_pick_chat_template(tok_cfg, model_dir),
                     eos_token_ids=frozenset(eos_ids), bos_token_id=None if bos_id is None else int(bos_id),
                     bos_token=bos_token, eos_token=eos_token)


def save_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> Path:
    """Write `tokenizer` as a Hugging Face directory that `load_tokenizer` reads back identically
    (ids, chat template, BOS/EOS). Loading it takes ~0.1 s against ~3 s for parsing a GGUF file,
    which matters when many processes start from one model (`laps local --engine emulated`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.backend.save(str(directory / "tokenizer.json"))
    config = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
    if tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "config.json").write_text(json.dumps(
        {"eos_token_id": sorted(tokenizer.eos_token_ids), "bos_token_id": tokenizer.bos_token_id}))
    return directory


__all__ = ["Tokenizer", "TokenizerError", "ChatTemplateError", "load_tokenizer", "save_tokenizer",
           "tokenizer_from_hf_dir"]


# A lone surrogate can only enter a parsed body through a \uD800-\uDFFF escape, or through
# the UTF-8-style bytes ED A0..BF xx that json.loads lets through ('surrogatepass'). Only bodies
# with one of those are walked, so the common case costs one regex scan of the raw bytes (its
# literal start the regex engine skips to; ~13 us per 40 KB) and a memchr for the byte ED (the
# second pattern runs only where there is one: never in ASCII bodies). One alternation of both
# patterns is scanned byte by byte, ~4x slower.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_RAW_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


def loads_json_text(raw: bytes) -> tuple[Any, bool]:
    """What json.loads makes of `raw` (a request body), and whether every string in it is
    known to be Unicode text. pydantic-core's JSON parser (Rust; ~7 us for 40 KB against ~35 for
    json.loads) reads it first: it takes only UTF-8 JSON without lone surrogates, escaped or
    raw, so the flag is True and unencodable_text need not run. Whatever it refuses goes to
    json.loads, whose result or error every body thus gets (UTF-16/32, BOM, nesting deeper than
    the fast parser's limit, the error messages), with the flag False."""
    try:
        return from_json(raw), True
    except ValueError:
        return json.loads(raw), False


def unencodable_text(raw: bytes, body: Any) -> str | None:
    """Where in `body` (parsed from `raw`) a string holds a lone surrogate, which is not Unicode
    text: no tokenizer can encode it (HF tokenizers raise TypeError, UTF-8 encoding fails), so
    it is the client's error. Returns a path like `messages[0].content`, or None."""
    if not _ESCAPED_SURROGATE.search(raw) and not (b"\xed" in raw and _RAW_SURROGATE.search(raw)):
        return None
    stack: list[tuple[str, Any]] = [("body", body)]
    while stack:  # iterative: the body may be nested as deep as the JSON parser allows
        path, value = stack.pop()
        if isinstance(value, str):
            if not _encodes(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _encodes(key):
                    return f"a key of {path}"
                stack.append((key if path == "body" else f"{path}.{key}", item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unencodable_message(where: str) -> str:
    return (f"{where} is not valid Unicode text (it holds a lone UTF-16 surrogate, e.g. "
            f"\\ud800, which no tokenizer can encode)")
