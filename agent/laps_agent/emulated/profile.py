"""Engine profiles: the cost model an emulated engine (and `laps sim`) takes its time from.

A profile is a YAML file (the shipped ones live in `profiles/`, named by their file stem). Every
duration is in seconds. Fields:

  name, description          what the profile stands for (model, device, parallelism)
  provenance                 "fitted from measurements" or "derived from published figures"
  source                     free text: how it was fitted, or the figures and where they are from
  model.kv_bytes_per_token   bytes of K+V one token holds (layers * 2 * kv_heads * head_dim * dtype)
  engine.kv_capacity_tokens  KV pool of one engine, in tokens
  engine.page_size           KV page size in tokens (capacity and reservations round to pages)
  engine.context_length      longest sequence (prompt + output) an engine takes
  engine.max_running_requests / max_prefill_tokens
                             defaults for the engine flags of the same names
  prefill                    one prefill batch of requests with u_i uncached and c_i cached tokens:
                               overhead_s + per_request_s * n + per_token_s * sum(u_i)
                               + attention_s * sum(u_i * (c_i + u_i))
  prefill.graph              optional: a short batch replayed as a CUDA graph of bucket (B, S):
                               graph.overhead_s + graph.per_token_s * B * S + attention_s * B * S^2
                             Without it (CPU) a bucketed batch costs the eager formula on the
                             padded shape (B sequences of S tokens): padding is plain extra work.
  decode                     one decode step of a batch of n sequences holding C context tokens:
                               overhead_s + per_request_s * n + per_context_token_s * C
  transfer                   KV hand-off of T tokens: latency_s + T * kv_bytes_per_token / bytes_per_s
  fit                        optional record of the fit (samples, error), informational

`laps bench profile` re-measures the builtin engine on this machine, fits these coefficients
and prints the fit error of the shipped `cpu-smollm2` profile.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

PROFILE_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "cpu-smollm2"


class ProfileError(ValueError):
    """A profile name that does not exist, or a file that is not a valid profile."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelFacts(_Strict):
    name: str
    kv_bytes_per_token: int = Field(gt=0)


class EngineFacts(_Strict):
    kv_capacity_tokens: int = Field(gt=0)
    page_size: int = Field(default=16, gt=0)
    context_length: int = Field(gt=1)
    max_running_requests: int = Field(default=32, ge=1)
    max_prefill_tokens: int = Field(default=8192, ge=1)


class GraphCost(_Strict):
    overhead_s: float = Field(ge=0)
    per_token_s: float = Field(ge=0)


class PrefillCost(_Strict):
    overhead_s: float = Field(ge=0)
    per_request_s: float = Field(default=0.0, ge=0)
    per_token_s: float = Field(ge=0)
    attention_s: float = Field(default=0.0, ge=0)
    graph: GraphCost | None = None


class DecodeCost(_Strict):
    overhead_s: float = Field(ge=0)
    per_request_s: float = Field(default=0.0, ge=0)
    per_context_token_s: float = Field(default=0.0, ge=0)


class TransferCost(_Strict):
    latency_s: float = Field(default=0.0, ge=0)
    bytes_per_s: float = Field(gt=0)


class Profile(_Strict):
    name: str
    description: str = ""
    provenance: str
    source: str = ""
    model: ModelFacts
    engine: EngineFacts
    prefill: PrefillCost
    decode: DecodeCost
    transfer: TransferCost
    fit: dict[str, Any] | None = None

    @property
    def graphs(self) -> bool:
        """Whether this device replays short batches as CUDA graphs (buckets pay off)."""
        return self.prefill.graph is not None

    def prefill_seconds(self, uncached: Sequence[int], cached: Sequence[int] | None = None,
                        bucket: tuple[int, int] | None = None) -> float:
        """One prefill batch: eager on these requests, or replayed/padded in `bucket` (B, S)."""
        p = self.prefill
        if bucket is not None:
            b, s = bucket
            if p.graph is not None:
                return p.graph.overhead_s + p.graph.per_token_s * b * s + p.attention_s * b * s * s
            return p.overhead_s + p.per_request_s * b + p.per_token_s * b * s + p.attention_s * b * s * s
        cached = cached if cached is not None else (0,) * len(uncached)
        attention = sum(u * (c + u) for u, c in zip(uncached, cached))
        return (p.overhead_s + p.per_request_s * len(uncached) + p.per_token_s * sum(uncached)
                + p.attention_s * attention)

    def decode_seconds(self, batch: int, context_tokens: int) -> float:
        d = self.decode
        return d.overhead_s + d.per_request_s * batch + d.per_context_token_s * context_tokens

    def transfer_seconds(self, tokens: int) -> float:
        t = self.transfer
        return t.latency_s + tokens * self.model.kv_bytes_per_token / t.bytes_per_s

    def kv_capacity_pages(self) -> int:
        return self.engine.kv_capacity_tokens // self.engine.page_size


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def _format(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'profile'}: {e['msg']}" for e in exc.errors())


def parse_profile(data: Any, origin: str = "profile") -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: a profile is a YAML mapping")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{origin}: {_format(exc)}") from None


def load_profile(name_or_path: str | Path | None = None) -> Profile:
    """A shipped profile by name (`cpu-smollm2`, ...) or a YAML file by path."""
    key = str(name_or_path or DEFAULT_PROFILE)
    path = Path(key)
    if not (path.suffix in (".yaml", ".yml") or path.exists()):
        path = PROFILE_DIR / f"{key}.yaml"
        if not path.exists():
            raise ProfileError(f"unknown profile {key!r}; shipped profiles: {', '.join(available_profiles())} "
                               "(or give a path to a YAML file)")
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from None
    return parse_profile(data, str(path))


def relative_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured if measured > 0 else math.inf
