"""The host-side inputs of one padded [B, S] batch (a bucket): the eager bucket path of the runner
(runner.py) and its CUDA-graph path (cuda_graphs.py) both lay a batch out with
`build_bucket_inputs`; the graph path copies the result into its static buffers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from laps_agent.engine.core.forward import ForwardItem
from laps_agent.policy.scheduling.buckets import PaddingPlan


def pages_needed(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


@dataclass
class BucketInputs:
    """Host-side metadata of one padded batch; the graph path copies these into its buffers."""
    input_ids: torch.Tensor   # [B*S] long
    positions: torch.Tensor   # [B*S] long
    slots: torch.Tensor       # [B*S] long, flat KV slot each token writes
    page_table: torch.Tensor  # [B, W] int32
    kv_lens: torch.Tensor     # [B] int32


def build_bucket_inputs(items: Sequence[ForwardItem], plan: PaddingPlan, *, page_size: int,
                        scratch_page: int, width: int) -> BucketInputs:
    """Place items into the slots of `plan`; everything not real points at the scratch page."""
    b, s = plan.bucket.batch_size, plan.bucket.seq_len
    input_ids = torch.zeros(b * s, dtype=torch.long)
    positions = torch.zeros(b * s, dtype=torch.long)
    slots = torch.full((b * s,), scratch_page * page_size, dtype=torch.long)
    page_table = torch.full((b, width), scratch_page, dtype=torch.int32)
    kv_lens = torch.ones(b, dtype=torch.int32)  # a dummy slot's single token sees itself
    for i, item in enumerate(items):
        slot = plan.slots[i]
        n = len(item.token_ids)
        pos = torch.arange(item.start_pos, item.start_pos + n)
        pages = torch.tensor(item.pages, dtype=torch.long)
        input_ids[slot.start:slot.start + n] = torch.tensor(item.token_ids, dtype=torch.long)
        positions[slot.start:slot.start + n] = pos
        slots[slot.start:slot.start + n] = pages[pos // page_size] * page_size + pos % page_size
        needed = pages_needed(item.start_pos + n, page_size)
        page_table[i, :needed] = pages[:needed].to(torch.int32)
        kv_lens[i] = item.start_pos + n
    return BucketInputs(input_ids, positions, slots, page_table, kv_lens)
