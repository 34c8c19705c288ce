"""A seeded random Llama-family model directory for fast tests.

Same file layout as a Hugging Face checkpoint (config.json, model.safetensors or shards with an
index, tokenizer.json, tokenizer_config.json with a ChatML template), so it exercises the real
loading path while a forward pass takes milliseconds.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from laps_agent.engine.model.config import ModelConfig
from laps_agent.engine.model.llama import CausalLM

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A little text to learn merges from: enough that common words become single tokens.
_CORPUS = """
The quick brown fox jumps over the lazy dog. What is the capital of France? The capital of France
is Paris. Hello world! Large language models generate text one token at a time. Prefill computes
the key and value cache for the prompt; decode appends one token per step. Short prompts and long
prompts are scheduled in separate queues so that the short ones are not blocked behind the long
ones. Kubernetes runs the prefill and decode engines as pods. 0123456789 are digits.
""" * 4

TINY_DEFAULTS: dict[str, Any] = dict(
    architecture="llama", vocab_size=384, hidden_size=64, intermediate_size=128, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=True, attention_bias=False, max_position_embeddings=4096,
    bos_token_id=1, eos_token_ids=(2,),
)


def build_tiny_tokenizer(vocab_size: int) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    return tok


def _random_state(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    model = CausalLM(config)
    state = {}
    for name, tensor in model.state_dict().items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(tensor.shape, generator=gen)
        elif name.endswith(".bias"):
            value = 0.1 * torch.randn(tensor.shape, generator=gen)
        elif "embed_tokens" in name:
            value = torch.randn(tensor.shape, generator=gen)
        else:  # fan-in scaling keeps activations O(1) so logits differ visibly between tokens
            value = torch.randn(tensor.shape, generator=gen) / tensor.shape[-1] ** 0.5
        state[name] = value.float().contiguous()
    return state


def write_tiny_model(path: Path, seed: int = 0, *, shards: int = 1, **overrides: Any) -> Path:
    """Write the model directory at `path` and return it. `overrides` replace ModelConfig fields
    (e.g. attention_bias=True for a Qwen2-like model); `shards` > 1 writes an index + shards."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fields = {**TINY_DEFAULTS, **overrides}
    tokenizer = build_tiny_tokenizer(int(fields["vocab_size"]))
    # The trainer may stop short of the requested size on a small corpus.
    fields["vocab_size"] = max(int(fields["vocab_size"]), tokenizer.get_vocab_size())
    config = ModelConfig(**fields)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": SPECIAL_TOKENS[1], "eos_token": SPECIAL_TOKENS[2],
        "chat_template": CHAT_TEMPLATE, "model_max_length": config.max_position_embeddings,
    }, indent=2))
    state = _random_state(config, seed)
    if shards <= 1:
        save_file(state, str(path / "model.safetensors"))
        return path
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[i::shards]}
        save_file(part, str(path / shard))
        weight_map.update({n: shard for n in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}, indent=2))
    return path
