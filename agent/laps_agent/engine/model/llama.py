"""Llama-family decoder (Llama, Qwen2, SmolLM2, Mistral without sliding window).

The model computes projections, RoPE, norms and the MLP over a flat batch of tokens. Attention
(where K/V live, which keys a query may see) belongs to the caller: `forward` takes an
`AttentionFn` that receives each layer's rotated q/k/v and returns the attention output. That keeps
the KV cache policy (pages, padding, CUDA-graph buffers) in the runner.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from laps_agent.engine.model.config import ModelConfig


class AttentionFn(Protocol):
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [N, heads, head_dim], k/v [N, kv_heads, head_dim] -> [N, heads, head_dim]."""


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling
    if scaling and scaling["type"] == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif scaling and scaling["type"] == "llama3":
        inv_freq = _llama3_scaled(inv_freq, scaling)
    return inv_freq.float()


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, a smooth ramp between.
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    middle = (wavelen <= original / low) & (wavelen >= original / high)
    return torch.where(middle, blended, out)


def rope_tables(angles: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """angles [N, D/2] -> (cos, signed sin) [N, 1, D] for `apply_rope`: built once per forward,
    so each layer's rotation is 4 kernels instead of 7 (on a GPU the eager path is bound by
    kernel launches, not arithmetic)."""
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), -1).to(dtype)[:, None], torch.cat((-sin, sin), -1).to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D] in the HF (half-split) layout. With x = (x1, x2): (x1 c - x2 s, x2 c + x1 s),
    written x * (c, c) + (x2, x1) * (-s, s), which rounds to the very same values."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), -1) * signed_sin


class Linear(nn.Module):
    """nn.Linear without random init: weights always come from a checkpoint, and skipping the
    init (or meta-device tricks, which import torch's decompositions) saves seconds per load."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # HF's order: normalise in fp32, round to the model's dtype, then scale. rms_norm is one
        # fused kernel on CUDA where pow/mean/add/rsqrt/mul were five.
        return F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype) * self.weight


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        h, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, kv, d
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, h * d, bias=bias)
        self.k_proj = Linear(config.hidden_size, kv * d, bias=bias)
        self.v_proj = Linear(config.hidden_size, kv * d, bias=bias)
        self.o_proj = Linear(h * d, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                layer: int, attention: AttentionFn) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        out = attention(layer, apply_rope(q, cos, signed_sin), apply_rope(k, cos, signed_sin), v)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SelfAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, signed_sin, layer: int, attention: AttentionFn) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, signed_sin, layer, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """Named like HF's `model.*` submodule so safetensors keys map one to one."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor,
                      attention: AttentionFn) -> torch.Tensor:
        """input_ids/positions [N] -> final-normed hidden states [N, hidden]."""
        x = self.model.embed_tokens(input_ids)
        # Angles in fp32 even for half-precision models: positions in the thousands need it.
        angles = positions.float()[:, None] * self.inv_freq.float()[None, :]
        cos, signed_sin = rope_tables(angles, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, signed_sin, i, attention)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
