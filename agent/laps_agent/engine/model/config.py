"""Shape and hyper-parameters of a Llama-family decoder, read from an HF config.json or GGUF metadata.

Torch-free so that the gateway and the engine loop can inspect a model without loading torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# Architectures whose decoder is the plain Llama block (differences are flags below).
SUPPORTED_ARCHITECTURES = frozenset({"llama", "qwen2", "mistral"})


class UnsupportedModelError(ValueError):
    """The model's files describe something this engine cannot run."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    # None, or {"type": "linear", "factor": f} / {"type": "llama3", "factor":..., ...}
    rope_scaling: Mapping[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim={self.head_dim} must be even for RoPE")

    @classmethod
    def from_hf_dict(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        model_type = str(cfg.get("model_type", "llama")).lower()
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported (supported: {sorted(SUPPORTED_ARCHITECTURES)})")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            eos = cfg.get("eos_token_id")
            rope = _rope_parameters(cfg)
            return cls(
                architecture=model_type,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                rope_scaling=_normalise_rope_scaling(rope or cfg.get("rope_scaling")),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases; Llama only when attention_bias says so.
                attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=tuple(_as_int_list(eos)),
            )
        except KeyError as missing:
            raise UnsupportedModelError(f"config.json lacks required field {missing}") from None

    def to_hf_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "architectures": ["Qwen2ForCausalLM" if self.architecture == "qwen2" else "LlamaForCausalLM"],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }
        if self.bos_token_id is not None:
            out["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            out["eos_token_id"] = list(self.eos_token_ids)
        return out


def _as_int_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _rope_parameters(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """transformers >= 5 writes RoPE as one `rope_parameters` dict (`rope_theta`, `rope_type`
    and the scaling fields) instead of top-level `rope_theta` + `rope_scaling`. Ignored, a
    SmolLM2 config saved that way (theta 100000) ran at the default 10000: every position past
    the first few got wrong attention, and answers changed. {} for the older layout."""
    raw = cfg.get("rope_parameters")
    if not raw:
        return {}
    if not isinstance(raw, Mapping) or any(isinstance(v, Mapping) for v in raw.values()):
        # Per-layer-type parameters ({"full_attention": {...}, ...}): no Llama-family model has them.
        raise UnsupportedModelError(f"rope_parameters {raw!r} is not supported (one flat dict expected)")
    return dict(raw)


def _normalise_rope_scaling(raw: Any) -> Mapping[str, Any] | None:
    if not raw:
        return None
    scaling = dict(raw)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind not in ("linear", "llama3"):
        raise UnsupportedModelError(f"rope_scaling type {kind!r} is not supported (linear, llama3)")
    scaling["type"] = kind
    return scaling
