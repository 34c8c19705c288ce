"""How a real engine turns a text prompt into tokens, for a model whose tokenizer adds a BOS (as
Llama's do): completions and /generate get it, as SGLang and vLLM encode them; a chat's
template writes its own special tokens."""
from __future__ import annotations

import httpx
import pytest

from laps_agent.engine.model.loader import load_model
from tests.unit.engine_model.gguf_writer import write_gguf_from_hf_dir

TEXT = "The quick brown fox"


@pytest.fixture(scope="module")
def bos_model(tiny_engine_model, tmp_path_factory):
    return write_gguf_from_hf_dir(tiny_engine_model, tmp_path_factory.mktemp("bos") / "tiny-bos.gguf",
                                  add_bos=True)


def test_a_text_prompt_gets_the_bos_its_tokenizer_adds(engine_launcher, bos_model):
    tok = load_model(bos_model).tokenizer
    with_bos = tok.encode(TEXT, add_special_tokens=True)
    assert with_bos[0] == tok.bos_token_id and with_bos[1:] == tok.encode(TEXT)
    engine = engine_launcher(bos_model, "mixed", ("--kv-pages", "64"))
    sampling = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    by_ids = httpx.post(engine.url + "/generate", json={"input_ids": with_bos, "sampling_params": sampling},
                        timeout=60).json()
    by_text = httpx.post(engine.url + "/generate", json={"text": TEXT, "sampling_params": sampling},
                         timeout=60).json()
    assert by_text["meta_info"]["prompt_tokens"] == len(with_bos)
    assert by_text["output_ids"] == by_ids["output_ids"]
    completion = httpx.post(engine.url + "/v1/completions", json={
        "model": "test-model", "prompt": TEXT, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
        timeout=60).json()
    assert completion["usage"]["prompt_tokens"] == len(with_bos)
    assert completion["choices"][0]["text"] == by_ids["text"]
    messages = [{"role": "user", "content": TEXT}]
    chat = httpx.post(engine.url + "/v1/chat/completions", json={
        "model": "test-model", "messages": messages, "max_tokens": 2}, timeout=60).json()
    assert chat["usage"]["prompt_tokens"] == len(tok.encode(tok.apply_chat_template(messages)))
