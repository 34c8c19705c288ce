"""Attention over the paged KV pool.

Pool layout per layer: [num_pages + 1, page_size, kv_heads, head_dim]; the last page is the
runner's scratch page, where padding and dummy tokens write so they never touch real pages.

Mask convention (shared by the eager, bucket and CUDA-graph paths, and by flash-attn's
`causal=True` with a KV cache): bottom-right aligned. In a block of q_len queries over a sequence
whose KV holds kv_len tokens, query t sits at absolute position kv_len - q_len + t and sees keys
j <= that position. Right-aligned padding keeps every real query at its true position; a
left-aligned block would shift them and hide part of their prefix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend

try:  # only useful on CUDA; the PyPI sdist cannot be built on CPU machines
    from flash_attn import flash_attn_with_kvcache  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001 - any import failure means "not available"
    flash_attn_with_kvcache = None

# flash-attn 2's paged KV cache needs pages of a multiple of 256 tokens.
FLASH_PAGE_MULTIPLE = 256

# SDPA kernels for the eager paths, which meet a new (query, key) length nearly every call, as
# serving sees a new prompt length nearly every request. cuDNN's attention plans each new shape:
# on an H100 a 300-token prefill of a new length each time took 55.6 ms with it and 16.4 ms
# without (scripts/profile_engine.py), so the eager paths go without it. CUDA graphs, whose
# shapes are fixed and planned once at capture, keep it.
EAGER_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def masked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SDPA with a bool mask; q [B, H, S, D], k/v [B, KVH, L, D] (grouped query heads).

    On CUDA the K/V heads are repeated for their query heads first: the memory-efficient kernel
    takes any mask but not grouped heads, flash takes no mask, so a grouped masked call would
    fall to cuDNN (planning each shape, above) or to the math kernel (fp32 scores of [H, S, L],
    gigabytes for a long cached prefix). CPU takes grouped heads with a mask as they are."""
    grouped = k.shape[1] != q.shape[1]
    if grouped and q.is_cuda:
        group = q.shape[1] // k.shape[1]
        k, v, grouped = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), False
    # enable_gqa only where heads are grouped: some kernels refuse the flag itself.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)


def bottom_right_causal_mask(q_len: int, kv_lens: torch.Tensor, key_len: int) -> torch.Tensor:
    """bool [B, q_len, key_len]: True where query t of sequence b may attend to key j.

    Queries that would see nothing (padding in front of a short sequence) get key 0 so softmax
    stays finite; their outputs are never read.
    """
    device = kv_lens.device
    q_pos = kv_lens.long()[:, None] - q_len + torch.arange(q_len, device=device)[None, :]
    keys = torch.arange(key_len, device=device)
    allowed = keys[None, None, :] <= q_pos[:, :, None]
    fallback = torch.zeros_like(allowed)
    fallback[..., 0] = True
    return allowed | (fallback & ~allowed.any(-1, keepdim=True))


def write_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """Store k/v [N, kv_heads, D] at flat slots (page * page_size + offset) of one layer's pool."""
    kv_heads, dim = k_pool.shape[-2:]
    k_pool.view(-1, kv_heads, dim).index_copy_(0, slots, k.to(k_pool.dtype))
    v_pool.view(-1, kv_heads, dim).index_copy_(0, slots, v.to(v_pool.dtype))


def gather_pages(pool: torch.Tensor, page_table: torch.Tensor) -> torch.Tensor:
    """pool [pages, page_size, H, D], page_table [B, W] -> [B, W * page_size, H, D]."""
    b, w = page_table.shape
    gathered = pool[page_table.long()]
    return gathered.view(b, w * pool.shape[1], *pool.shape[2:])


def sdpa_paged(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
               page_table: torch.Tensor, kv_lens: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, S, H, D] (bottom-right aligned blocks) -> [B, S, H, D] with torch SDPA.
    `mask` may be passed in precomputed (it is the same for every layer)."""
    keys = gather_pages(k_pool, page_table)
    values = gather_pages(v_pool, page_table)
    if mask is None:
        mask = bottom_right_causal_mask(q.shape[1], kv_lens, keys.shape[1])
    out = masked_sdpa(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), mask[:, None])
    return out.transpose(1, 2)


def flash_applies(q: torch.Tensor) -> bool:
    """flash-attn is importable and supports this query (CUDA, fp16/bf16)."""
    return flash_attn_with_kvcache is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    page_table: torch.Tensor, kv_lens: torch.Tensor,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """flash-attn where it applies, else SDPA; the same bottom-right mask either way."""
    if flash_applies(q):
        lens = kv_lens.int()
        if k_pool.shape[1] % FLASH_PAGE_MULTIPLE == 0:  # its paged kernel reads our pages directly
            return flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=lens,
                                           block_table=page_table.int(), causal=True)
        # Smaller pages: gather them into a contiguous cache; the kernel still masks by length.
        return flash_attn_with_kvcache(q, gather_pages(k_pool, page_table), gather_pages(v_pool, page_table),
                                       cache_seqlens=lens, causal=True)
    return sdpa_paged(q, k_pool, v_pool, page_table, kv_lens, mask)


@dataclass
class BlockAttention:
    """AttentionFn for a [B, S] block of tokens (the bucket / CUDA-graph path and batched decode).

    All metadata are tensors so the same object works with preallocated CUDA-graph buffers.
    """
    k_pool: torch.Tensor        # [layers, pages + 1, page_size, kv_heads, D]
    v_pool: torch.Tensor
    slots: torch.Tensor         # [B * S] flat write slot of each token
    page_table: torch.Tensor    # [B, W]
    kv_lens: torch.Tensor       # [B] tokens in KV after this step
    batch: int
    seq_len: int

    def __post_init__(self) -> None:
        self._mask: torch.Tensor | None = None

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_pool, v_pool = self.k_pool[layer], self.v_pool[layer]
        write_kv(k_pool, v_pool, self.slots, k, v)
        heads, dim = q.shape[-2:]
        q = q.view(self.batch, self.seq_len, heads, dim)
        if self._mask is None and not flash_applies(q):  # once per forward, not per layer
            key_len = self.page_table.shape[1] * k_pool.shape[1]
            self._mask = bottom_right_causal_mask(self.seq_len, self.kv_lens, key_len)
        out = paged_attention(q, k_pool, v_pool, self.page_table, self.kv_lens, self._mask)
        return out.reshape(self.batch * self.seq_len, heads, dim)


@dataclass
class PackedAttention:
    """AttentionFn for a packed (unpadded) batch: sequence i owns tokens [offsets[i], offsets[i+1]).

    Used by the eager path; each multi-token sequence is attended on its own, single-token
    sequences (decode) together as one [B, 1] block.
    """
    k_pool: torch.Tensor
    v_pool: torch.Tensor
    slots: torch.Tensor                 # [N]
    offsets: list[int]                  # len B + 1
    page_tables: list[torch.Tensor]     # per sequence: its pages covering kv_len
    kv_lens: list[int]
    decode_rows: list[int]              # sequences with exactly one new token
    decode_table: torch.Tensor | None   # [len(decode_rows), W] padded with the scratch page
    decode_kv_lens: torch.Tensor | None

    def __post_init__(self) -> None:
        self._decode_tokens = (torch.tensor([self.offsets[i] for i in self.decode_rows], device=self.slots.device)
                               if self.decode_rows else None)
        self._decode_set = set(self.decode_rows)
        self._decode_mask: torch.Tensor | None = None

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_pool, v_pool = self.k_pool[layer], self.v_pool[layer]
        write_kv(k_pool, v_pool, self.slots, k, v)
        out = torch.empty_like(q)
        if self._decode_tokens is not None:
            idx = self._decode_tokens
            q_block = q[idx][:, None]
            if self._decode_mask is None and not flash_applies(q_block):
                key_len = self.decode_table.shape[1] * k_pool.shape[1]
                self._decode_mask = bottom_right_causal_mask(1, self.decode_kv_lens, key_len)
            block = paged_attention(q_block, k_pool, v_pool, self.decode_table, self.decode_kv_lens,
                                    self._decode_mask)
            out[idx] = block[:, 0]
        for i, (lo, hi) in enumerate(zip(self.offsets, self.offsets[1:])):
            if i in self._decode_set:
                continue
            kv_len = self.kv_lens[i]
            qi = q[lo:hi].transpose(0, 1)[None]
            if kv_len == hi - lo:
                # No cached prefix: its keys are the ones just written, as the pool holds them,
                # with no gather from the pool (two kernels a layer, each launch counts on a GPU);
                # the plain causal mask is the bottom-right one.
                keys, values = k[lo:hi].to(k_pool.dtype), v[lo:hi].to(v_pool.dtype)
                o = F.scaled_dot_product_attention(qi, keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                                                   is_causal=True, enable_gqa=keys.shape[1] != qi.shape[1])
            else:
                keys = gather_pages(k_pool, self.page_tables[i][None])[0, :kv_len]
                values = gather_pages(v_pool, self.page_tables[i][None])[0, :kv_len]
                mask = bottom_right_causal_mask(hi - lo, torch.tensor([kv_len], device=q.device), kv_len)
                o = masked_sdpa(qi, keys.transpose(0, 1)[None], values.transpose(0, 1)[None], mask[:, None])
            out[lo:hi] = o[0].transpose(0, 1)
        return out
