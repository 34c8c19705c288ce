"""Loading HF directories (single file, sharded) and GGUF files; config fields are honoured."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from laps_agent.engine.model.loader import ModelLoadError, default_model_path, load_model
from laps_agent.engine.model.runner import ForwardItem, ModelRunner
from tests.support.tiny_model import write_tiny_model
from tests.unit.engine_model.gguf_writer import write_gguf_from_hf_dir


def _logits(loaded, ids: list[int]) -> torch.Tensor:
    runner = ModelRunner(loaded, num_pages=16, page_size=8)
    return runner.forward([ForwardItem(ids, 0, list(range(-(-len(ids) // 8))))])[0][0]


def test_default_model_path_is_the_packaged_smollm2_gguf():
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_tiny_hf_dir_loads_with_its_config(tiny_model_dir):
    loaded = load_model(tiny_model_dir)
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert loaded.name == "tiny-llama"
    assert loaded.config.num_layers == cfg["num_hidden_layers"] == len(loaded.model.model.layers)
    assert (loaded.config.num_heads, loaded.config.num_kv_heads) == (4, 2)
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight  # tied
    assert loaded.tokenizer.vocab_size <= loaded.config.vocab_size


def test_config_fields_are_honoured(tmp_path):
    """Qwen2-style biases, untied head, another RoPE base, 3 layers, sharded safetensors."""
    path = write_tiny_model(tmp_path / "qwenish", seed=3, shards=3, architecture="qwen2",
                            attention_bias=True, tie_word_embeddings=False, rope_theta=500.0,
                            num_layers=3, num_heads=6, num_kv_heads=3, head_dim=8)
    assert (path / "model.safetensors.index.json").exists()
    loaded = load_model(path)
    cfg = loaded.config
    assert (cfg.architecture, cfg.num_layers, cfg.rope_theta) == ("qwen2", 3, 500.0)
    assert cfg.attention_bias and not cfg.tie_word_embeddings
    model = loaded.model
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    saved = {}
    for shard in sorted(path.glob("model-*.safetensors")):
        saved.update(load_file(str(shard)))
    assert torch.equal(model.lm_head.weight, saved["lm_head.weight"])
    assert torch.equal(model.model.layers[2].self_attn.k_proj.bias, saved["model.layers.2.self_attn.k_proj.bias"])
    # RoPE base matters: the same weights with a different theta give different logits.
    other = json.loads((path / "config.json").read_text())
    other["rope_theta"] = 10000.0
    (path / "config.json").write_text(json.dumps(other))
    ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    assert not torch.allclose(_logits(loaded, ids), _logits(load_model(path), ids), atol=1e-3)


def test_a_transformers_5_config_gives_the_same_model_as_the_older_layout(tmp_path):
    """transformers >= 5 saves RoPE as `rope_parameters` (no top-level `rope_theta`): a SmolLM2
    saved that way, read at the default theta, answered differently from its GGUF."""
    older = write_tiny_model(tmp_path / "older", seed=3, rope_theta=500.0)
    newer = write_tiny_model(tmp_path / "newer", seed=3, rope_theta=500.0)
    cfg = json.loads((newer / "config.json").read_text())
    cfg.pop("rope_scaling", None)
    cfg["rope_parameters"] = {"rope_theta": cfg.pop("rope_theta"), "rope_type": "default"}
    (newer / "config.json").write_text(json.dumps(cfg))
    a, b = load_model(older), load_model(newer)
    assert b.config == a.config
    ids = a.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    assert torch.equal(_logits(b, ids), _logits(a, ids))


@pytest.mark.parametrize("overrides", [
    {},  # Llama: Q/K stored permuted
    {"architecture": "qwen2", "attention_bias": True, "tie_word_embeddings": False},  # stored as is
], ids=["llama", "qwen2"])
def test_gguf_of_a_tiny_model_gives_the_same_logits(tmp_path, overrides):
    """The GGUF path (metadata config, Q/K layout, tokenizer from metadata) == the HF path."""
    hf_dir = write_tiny_model(tmp_path / "hf", seed=5, **overrides)
    from_hf = load_model(hf_dir)
    from_gguf = load_model(write_gguf_from_hf_dir(hf_dir, tmp_path / "tiny.gguf", add_bos=True))
    assert from_gguf.config == from_hf.config
    text = "What is the capital of France? 42"
    ids = from_hf.tokenizer.encode(text)
    assert from_gguf.tokenizer.encode(text) == ids
    assert from_gguf.tokenizer.eos_token_ids == from_hf.tokenizer.eos_token_ids
    assert from_gguf.tokenizer.encode(text, add_special_tokens=True) == [from_hf.config.bos_token_id, *ids]
    assert (_logits(from_gguf, ids) - _logits(from_hf, ids)).abs().max().item() <= 1e-5


def test_bad_model_paths_give_clear_errors(tmp_path, tiny_model_dir):
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(tmp_path / "missing")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="expected a .gguf"):
        load_model(tmp_path / "weights.bin")
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_neox"}))
    with pytest.raises(ModelLoadError, match="gpt_neox"):
        load_model(bad)
    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "model.safetensors").write_bytes((tiny_model_dir / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        load_model(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "hidden_size": 32}))
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (bad / f).write_bytes((tiny_model_dir / f).read_bytes())
    with pytest.raises(ModelLoadError, match="shape"):
        load_model(bad)
