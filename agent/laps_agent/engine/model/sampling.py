"""Next-token choice on the logits (torch); parameters and stop detection are in sampling_params.

Random draws use a generator re-seeded from (seed, step) at every step, so a seeded request gives
the same tokens whether it runs in one `mixed` engine or is split between a prefill engine (step 0)
and a decode engine (steps 1..n)."""
from __future__ import annotations

from typing import Sequence

import torch

from laps_agent.engine.core.sampling_params import DEFAULT_MAX_NEW_TOKENS, SamplingError, SamplingParams, StopState  # noqa: F401


def sample_tokens(logits: torch.Tensor, params: Sequence[SamplingParams], steps: Sequence[int]) -> list[int]:
    """One next token per row of `logits` [n, vocab]; `steps[i]` is how many tokens row i's request
    has generated so far (for per-step seeding). Raises SamplingError on the first row that fails."""
    out = sample_each(logits, params, steps)
    for token in out:
        if isinstance(token, SamplingError):
            raise token
    return out  # type: ignore[return-value]


def sample_each(logits: torch.Tensor, params: Sequence[SamplingParams],
                steps: Sequence[int]) -> list[int | SamplingError]:
    """Like sample_tokens, but a row that cannot be sampled gives its SamplingError in its place:
    the engine fails that request alone and goes on with the others of the batch."""
    out: list[int | SamplingError] = []
    greedy_rows = [i for i, p in enumerate(params) if p.greedy]
    argmax = logits.argmax(dim=-1).tolist() if greedy_rows else []
    for i, p in enumerate(params):
        if p.greedy:
            out.append(int(argmax[i]))
            continue
        try:
            out.append(_sample_row(logits[i], p, steps[i]))
        except (RuntimeError, ValueError) as exc:  # torch's own complaints, e.g. from multinomial
            out.append(exc if isinstance(exc, SamplingError) else SamplingError(f"sampling failed: {exc}"))
    return out


def _sample_row(row: torch.Tensor, p: SamplingParams, step: int) -> int:
    scores = row.float() / p.temperature
    if p.top_k > 0 and p.top_k < scores.numel():
        kth = torch.topk(scores, p.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if not torch.isfinite(probs).all():
        raise SamplingError(f"sampling failed: temperature {p.temperature:g} makes the distribution "
                            "overflow; use a larger temperature or 0 for greedy")
    if p.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= p.top_p, 0.0)  # keep the nucleus (>= 1 token)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    generator = None
    if p.seed is not None:
        # On the logits' device: a CPU generator cannot drive multinomial on CUDA logits.
        generator = torch.Generator(device=row.device).manual_seed((p.seed * 1_000_003 + step) % (2**63))
    return int(torch.multinomial(probs, 1, generator=generator).item())
