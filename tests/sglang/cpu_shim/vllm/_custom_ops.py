"""Test-only: the one vLLM op SGLang 0.5.23 imports on a CPU without its CPU kernels.

Why it exists: SGLang's RotaryEmbedding (srt/layers/rotary_embedding/base.py) imports
`vllm._custom_ops.rotary_embedding` on every device that is not CUDA/HIP/an explicit CPU
build, and the published sglang-kernel wheel has no CPU ops, so a CPU test run of a stock
SGLang cannot start without it. This is the same computation in plain torch (in place, like
the kernel). It is put on PYTHONPATH only for the SGLang servers the tests start; nothing
outside tests/ ships it.
"""
from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    if is_neox:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    positions = positions.flatten()
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    rot_dim = cos_sin_cache.shape[-1]
    for x in (query, key):
        if x is None:
            continue
        view = x.view(positions.shape[0], -1, head_size)
        part = view[..., :rot_dim]
        c, s = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
        part.copy_(_rotate(part, c, s, is_neox))
