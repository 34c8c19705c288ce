"""Load a model from a local path: a GGUF file or a Hugging Face directory. Never downloads."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from laps_agent.engine.model.config import ModelConfig, UnsupportedModelError
from laps_agent.engine.model.gguf_loader import read_gguf
from laps_agent.engine.model.llama import CausalLM, rope_inverse_frequencies
from laps_agent.modelio.gguf_metadata import GGUFFormatError
from laps_agent.modelio.model_files import DEFAULT_GGUF_NAME, ModelLoadError, default_model_path  # noqa: F401 (re-exported)
from laps_agent.modelio.tokenizer import Tokenizer, TokenizerError, tokenizer_from_hf_dir
from laps_agent.modelio.tokenizer_gguf import tokenizer_from_gguf

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: ModelConfig
    tokenizer: Tokenizer
    name: str


def load_model(path: str | Path, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> LoadedModel:
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or directory")
    try:
        if path.is_file() and path.suffix == ".gguf":
            config, state, metadata = read_gguf(path)
            tokenizer = tokenizer_from_gguf(metadata)
            name = path.stem
        elif path.is_dir():
            config = _hf_config(path)
            state = _read_safetensors(path)
            tokenizer = tokenizer_from_hf_dir(path)
            name = path.name
        else:
            raise ModelLoadError(f"{path}: expected a .gguf file or a Hugging Face model directory")
    except (UnsupportedModelError, TokenizerError, GGUFFormatError) as err:
        raise ModelLoadError(f"{path}: {err}") from err
    if config.eos_token_ids and not tokenizer.eos_token_ids:
        tokenizer.eos_token_ids = frozenset(config.eos_token_ids)
    model = build_model(config, state, dtype)
    model.to(device=device)
    # The RoPE frequencies stay fp32 whatever the weights' dtype (a bf16 table is off by ~1.75
    # rad at position 4000): computed afresh, never rounded through `dtype`.
    model.inv_freq = rope_inverse_frequencies(config).to(device)
    return LoadedModel(model=model, config=config, tokenizer=tokenizer, name=name)


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """`--dtype`: auto = bfloat16 on CUDA (what flash-attn needs), float32 on CPU (bf16 is 1.5-2.6x
    slower than fp32 on CPUs without bf16 units, as this one)."""
    if name == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {name!r}; choose from auto, {', '.join(DTYPES)}") from None


def build_model(config: ModelConfig, state: dict[str, torch.Tensor],
                dtype: torch.dtype = torch.float32) -> CausalLM:
    model = CausalLM(config)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = {k: v.shape for k, v in model.state_dict().items()
                if not (config.tie_word_embeddings and k == "lm_head.weight")}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(k for k in set(state) - set(expected) if "rotary_emb" not in k)
    if missing or unexpected:
        raise ModelLoadError(f"weights do not match the config: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
    for key, shape in expected.items():
        if tuple(state[key].shape) != tuple(shape):
            raise ModelLoadError(f"{key}: shape {tuple(state[key].shape)} != expected {tuple(shape)}")
    for key in expected:  # one tensor at a time: the full-precision copy goes as soon as it is cast
        state[key] = state[key].to(dtype)
    model.load_state_dict({k: state[k] for k in expected}, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval().requires_grad_(False)


def _hf_config(model_dir: Path) -> ModelConfig:
    cfg_file = model_dir / "config.json"
    if not cfg_file.exists():
        raise ModelLoadError(f"{model_dir}: no config.json")
    try:
        return ModelConfig.from_hf_dict(json.loads(cfg_file.read_text()))
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{cfg_file}: invalid JSON: {err}") from err
    except UnsupportedModelError as err:
        raise ModelLoadError(f"{cfg_file}: {err}") from err


def _read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / s for s in shards]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir}: no *.safetensors files")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state
