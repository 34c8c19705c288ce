"""RoPE frequencies honour rope_theta and the linear / llama3 scaling configs."""
from __future__ import annotations

import math

import pytest
import torch

from laps_agent.engine.model.config import ModelConfig, UnsupportedModelError
from laps_agent.engine.model.llama import rope_inverse_frequencies

BASE = dict(architecture="llama", vocab_size=32, hidden_size=64, intermediate_size=64, num_layers=1,
            num_heads=2, num_kv_heads=1, head_dim=32, rope_theta=500000.0)


def test_linear_scaling_divides_every_frequency():
    plain = rope_inverse_frequencies(ModelConfig(**BASE))
    scaled = rope_inverse_frequencies(ModelConfig(**BASE, rope_scaling={"type": "linear", "factor": 4.0}))
    assert torch.allclose(scaled, plain / 4)


def test_llama3_scaling_keeps_high_and_slows_low_frequencies():
    scaling = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    plain = rope_inverse_frequencies(ModelConfig(**BASE))
    scaled = rope_inverse_frequencies(ModelConfig(**BASE, rope_scaling=scaling))
    wavelen = 2 * math.pi / plain
    short, long = wavelen < 8192 / 4, wavelen > 8192 / 1
    assert short.any() and long.any()
    assert torch.allclose(scaled[short], plain[short])
    assert torch.allclose(scaled[long], plain[long] / 8)


def test_hf_config_rope_scaling_is_parsed_and_unknown_kinds_refused():
    cfg = {"model_type": "llama", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}
    assert ModelConfig.from_hf_dict({**cfg, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
                                    ).rope_scaling["type"] == "llama3"
    assert ModelConfig.from_hf_dict({**cfg, "rope_scaling": None}).rope_scaling is None
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelConfig.from_hf_dict({**cfg, "rope_scaling": {"type": "yarn", "factor": 4.0}})


def test_hf_config_rope_parameters_of_transformers_5_are_read():
    cfg = {"model_type": "llama", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}
    parsed = ModelConfig.from_hf_dict({**cfg, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "linear",
                                                                  "factor": 4.0}})
    assert parsed.rope_theta == 100000.0
    assert (parsed.rope_scaling["type"], parsed.rope_scaling["factor"]) == ("linear", 4.0)
    with pytest.raises(UnsupportedModelError, match="rope_parameters"):
        ModelConfig.from_hf_dict({**cfg, "rope_parameters": {"full_attention": {"rope_theta": 1e4}}})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotation_is_hf_rotate_half_to_the_bit(dtype):
    """The rotation is written as x * (c, c) + swap(x) * (-s, s) to launch fewer kernels; it must
    round to exactly HF's (x1 c - x2 s, x2 c + x1 s), with the tables in the model's dtype."""
    from laps_agent.engine.model.llama import apply_rope, rope_tables

    torch.manual_seed(0)
    x = torch.randn(40, 3, 32).to(dtype)
    angles = torch.arange(40, dtype=torch.float32)[:, None] * rope_inverse_frequencies(ModelConfig(**BASE))[None]
    c, s = angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]
    x1, x2 = x[..., :16], x[..., 16:]
    assert torch.equal(apply_rope(x, *rope_tables(angles, dtype)), torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1))
