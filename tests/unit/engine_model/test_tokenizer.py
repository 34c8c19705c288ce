"""Tokenizers from GGUF metadata and from an HF directory, and chat templates."""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from laps_agent.modelio.tokenizer import ChatTemplateError, TokenizerError, load_tokenizer

SAMPLES = ["Hello, world 123", "  two  spaces\n\nand lines", "héllo wörld 🤗 <tag>", ""]


@pytest.mark.slow
def test_gguf_tokenizer_round_trips_and_renders_chat(smollm2_loaded):
    tok = smollm2_loaded.tokenizer
    for text in SAMPLES:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("What is the capital of France?") == [1780, 314, 260, 3575, 282, 4649, 47]
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                      "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(prompt)
    assert ids[0] == tok.bos_token_id == 1 and ids.count(2) == 2  # specials are single tokens
    assert tok.decode(ids) == "system\nYou are a helpful AI assistant named SmolLM, trained by " \
                              "Hugging Face\nuser\nHi\nassistant\n"
    assert tok.decode(ids, skip_special_tokens=False) == prompt


def test_hf_dir_tokenizer(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    for text in SAMPLES:
        assert tok.decode(tok.encode(text)) == text
    assert tok.eos_token_ids == frozenset({2}) and tok.bos_token_id == 1
    # Like SmolLM2, the tiny tokenizer adds no BOS of its own.
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False) \
        == "<|im_start|>user\nhi<|im_end|>\n"
    with pytest.raises(ChatTemplateError, match="role"):
        tok.apply_chat_template([{"content": "no role"}])


def test_template_raise_exception_and_sandbox(tmp_path, tiny_model_dir):
    model = tmp_path / "m"
    model.mkdir()
    (model / "tokenizer.json").write_text((tiny_model_dir / "tokenizer.json").read_text())
    template = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}"
                "{% endif %}{{ messages[0].__class__.__mro__ }}")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    tok = load_tokenizer(model)
    with pytest.raises(ChatTemplateError, match="first message must be user"):
        tok.apply_chat_template([{"role": "system", "content": "x"}])
    with pytest.raises(ChatTemplateError):  # the sandbox refuses attribute escapes
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def _with_template(tmp_path, tiny_model_dir, template: str) -> Path:
    model = tmp_path / "m"
    model.mkdir()
    (model / "tokenizer.json").write_text((tiny_model_dir / "tokenizer.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
    return model


def test_templates_render_as_hugging_face_renders_them(tmp_path, tiny_model_dir):
    """Chat templates are written against transformers' environment: {% break %} and
    {% continue %} (a model using them could not be loaded at all), tojson as json.dumps (Jinja's
    own escapes <, > and non-ASCII for HTML: another prompt than the model learnt), its
    {% generation %} block (training masks) and strftime_now (Llama 3.x templates write today's
    date with it)."""
    template = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
                "{% generation %}{{ m.content | tojson }}{% endgeneration %}|"
                "{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}{{ strftime_now('%Y') }}")
    tok = load_tokenizer(_with_template(tmp_path, tiny_model_dir, template))
    messages = [{"role": "system", "content": "hidden"}, {"role": "user", "content": "<b>café</b>"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "never"}]
    assert tok.apply_chat_template(messages) == f'"<b>café</b>"|"a"|{datetime.date.today().year}'


def test_a_template_that_does_not_compile_is_a_tokenizer_error(tmp_path, tiny_model_dir):
    # A TokenizerError is what laps engine, laps gateway and laps local report as such (a line,
    # not a traceback).
    with pytest.raises(TokenizerError, match="chat template does not compile.*unknown tag 'nope'"):
        load_tokenizer(_with_template(tmp_path, tiny_model_dir, "{% nope %}"))


def test_missing_tokenizer_files_give_clear_errors(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="nope.bin: no such file or directory"):
        load_tokenizer(tmp_path / "nope.bin")
    (tmp_path / "notes.bin").write_text("not a model")
    with pytest.raises(TokenizerError, match="expected a .gguf"):
        load_tokenizer(tmp_path / "notes.bin")
    no_template = tmp_path / "m"
    no_template.mkdir()
    from tokenizers import Tokenizer, models
    Tokenizer(models.BPE()).save(str(no_template / "tokenizer.json"))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        load_tokenizer(no_template).apply_chat_template([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("change,named", [
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.tokens": [1, 2, 3]}, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.merges": ["nospace"]}, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.merges": ["zzzq qqqz"]}, "tokenizer.ggml.merges"),  # tokens the vocabulary lacks
    ({"tokenizer.ggml.token_type": [1]}, "tokenizer.ggml.token_type"),
    ({"tokenizer.ggml.bos_token_id": 10**9}, "tokenizer.ggml.bos_token_id"),
    ({"tokenizer.ggml.eos_token_id": "2"}, "tokenizer.ggml.eos_token_id"),
])
def test_a_gguf_with_a_broken_vocabulary_is_a_tokenizer_error_naming_the_key(smollm2_path, change, named):
    """A hand-made or damaged GGUF: the gateway and the engine refuse it with the key at fault,
    not a TypeError or IndexError from deep inside (a missing token list was `len(None)`)."""
    from laps_agent.modelio.gguf_metadata import read_gguf_metadata
    from laps_agent.modelio.tokenizer_gguf import tokenizer_from_gguf, tokenizer_key

    metadata = {**read_gguf_metadata(smollm2_path, wanted=tokenizer_key), **change}
    metadata = {k: v for k, v in metadata.items() if v is not None}
    with pytest.raises(TokenizerError, match=named):
        tokenizer_from_gguf(metadata)


def test_a_gguf_with_a_bad_end_of_turn_id_still_loads(smollm2_path, caplog):
    """eot only adds a stop token: a bad one is said and ignored, as llama.cpp does."""
    from laps_agent.modelio.gguf_metadata import read_gguf_metadata
    from laps_agent.modelio.tokenizer_gguf import tokenizer_from_gguf, tokenizer_key

    metadata = {**read_gguf_metadata(smollm2_path, wanted=tokenizer_key), "tokenizer.ggml.eot_token_id": 10**9}
    tok = tokenizer_from_gguf(metadata)
    assert tok.eos_token_ids == frozenset({metadata["tokenizer.ggml.eos_token_id"]})
    assert "eot_token_id" in caplog.text and "ignored" in caplog.text
