"""Read a llama.cpp GGUF file into HF-named fp32 tensors and a ModelConfig.

The file's metadata and tensor table come from laps_agent.modelio.gguf_metadata (GGUFReader spends ~2 s
parsing the vocabulary alone); the tensor data is mapped, and quantised tensors are dequantised
with `gguf.quants.dequantize`. llama.cpp's converter permutes
the rows of Q and K so that its interleaved RoPE works; our RoPE is HF's half-split one, so the
permutation is undone here (Llama/Mistral only; Qwen2 is stored as is).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quant_shape_to_byte_shape

from laps_agent.engine.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, UnsupportedModelError
from laps_agent.modelio.gguf_metadata import GGUFLayout, read_gguf_layout

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# llama.cpp permutes Q/K only where it uses interleaved ("normal") RoPE; Qwen2 uses NeoX RoPE and
# is stored unpermuted.
_PERMUTED_QK_ARCHITECTURES = frozenset({"llama", "mistral"})
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _field(layout: GGUFLayout, key: str, default: Any = None) -> Any:
    return layout.metadata.get(key, default)


def _f32(value: Any) -> float:
    # GGUF stores float32: 1e-5 comes back as 9.9999997e-06. Use float32's shortest decimal form.
    return float(str(np.float32(value)))


def gguf_config(layout: GGUFLayout) -> ModelConfig:
    arch = _field(layout, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(f"GGUF architecture {arch!r} is not supported")

    def req(key: str) -> Any:
        value = _field(layout, f"{arch}.{key}")
        if value is None:
            raise UnsupportedModelError(f"GGUF metadata lacks {arch}.{key}")
        return value

    hidden, heads = int(req("embedding_length")), int(req("attention.head_count"))
    names = {t.name for t in layout.tensors}
    tokens = _field(layout, "tokenizer.ggml.tokens") or []
    vocab = int(_field(layout, f"{arch}.vocab_size", len(tokens)))
    scaling = None
    if _field(layout, f"{arch}.rope.scaling.type") == "linear":
        scaling = {"type": "linear", "factor": _f32(_field(layout, f"{arch}.rope.scaling.factor", 1.0))}
    eos = _field(layout, "tokenizer.ggml.eos_token_id")
    bos = _field(layout, "tokenizer.ggml.bos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(req("feed_forward_length")),
        num_layers=int(req("block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(layout, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(_field(layout, f"{arch}.attention.key_length", hidden // heads)),
        rope_theta=_f32(_field(layout, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_norm_eps=_f32(_field(layout, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        max_position_embeddings=int(_field(layout, f"{arch}.context_length", 4096)),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    # Inverse of llama.cpp's convert permute: reshape(h, 2, d/2, ...).swapaxes(1, 2).
    shape = w.shape
    return w.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _tensor_bytes(data: np.ndarray, dims: tuple[int, ...], kind: GGMLQuantizationType,
                  offset: int) -> np.ndarray:
    """The tensor's bytes in the mapped file, shaped as `dequantize` takes them (rows of blocks)."""
    if not dims:   # a scalar: no weight of a supported model is one
        raise UnsupportedModelError("a tensor has no dimensions")
    block, size = GGML_QUANT_SIZES[kind]
    count = math.prod(dims) * size // block
    if offset + count > data.size:
        raise UnsupportedModelError(f"the file ends inside its data (byte {offset} + {count})")
    return data[offset:offset + count].reshape(quant_shape_to_byte_shape(tuple(reversed(dims)), kind))


def gguf_state_dict(layout: GGUFLayout, path: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    data = np.memmap(path, dtype=np.uint8, mode="r")
    state: dict[str, torch.Tensor] = {}
    for tensor in layout.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            continue  # e.g. rope_freqs: recomputed from the config
        try:
            kind = GGMLQuantizationType(tensor.ggml_type)
        except ValueError:
            raise UnsupportedModelError(f"tensor {tensor.name} has unknown GGML type {tensor.ggml_type}") from None
        rows = [int(x) for x in reversed(tensor.dims)]  # GGUF lists dims innermost first
        try:   # a row that is not whole blocks, a type gguf cannot dequantise: name the tensor
            raw = _tensor_bytes(data, tensor.dims, kind, tensor.offset)
            values = np.array(dequantize(raw, kind), dtype=np.float32).reshape(rows)
        except (ValueError, NotImplementedError) as err:
            raise UnsupportedModelError(f"tensor {tensor.name} ({kind.name}): {err}") from None
        if config.architecture in _PERMUTED_QK_ARCHITECTURES:
            if ".self_attn.q_proj." in name:
                values = _unpermute(values, config.num_heads)
            elif ".self_attn.k_proj." in name:
                values = _unpermute(values, config.num_kv_heads)
        state[name] = torch.from_numpy(np.ascontiguousarray(values))  # values: a copy, not the mapped file
    return state


def model_key(key: str) -> bool:
    """The metadata an engine reads: of `general.*` only the architecture (the rest is name,
    description, license, ...: a stray non-UTF-8 byte there must not stop a model loading).
    The tensor data's alignment is read whatever this says."""
    return not key.startswith("general.") or key == "general.architecture"


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """(config, HF-named fp32 state dict, the metadata model_key keeps: the tokenizer's too)."""
    layout = read_gguf_layout(path, wanted=model_key)
    if not layout.little_endian:   # llama.cpp reads those only on a big-endian machine, too
        raise UnsupportedModelError("a big-endian GGUF file is not supported")
    config = gguf_config(layout)
    return config, gguf_state_dict(layout, path, config), layout.metadata
