"""ModelRunner: owns the model, the paged KV pool and the forward paths.

Paths:
- eager: packed tokens, no padding; decode batches and prefill batches without a bucket.
- bucket: the right-aligned padded [B, S] batch of `plan_padding`, run eagerly (CPU, or GPU
  without graphs). Reads each slot's logits at its last position.
- graph: the same bucket inputs copied into preallocated buffers and a CUDA graph replayed.
  Decode steps use it too: a decode batch of n requests is the bucket (b, 1) of the smallest
  decode batch size b >= n (the decode graph grid), padded with dummy slots like any bucket.

Page ids 0..num_pages-1 belong to the caller's allocator; page `num_pages` is a scratch page that
absorbs the K/V writes of padding and dummy tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch.nn.attention import sdpa_kernel

from laps_agent.engine.core.forward import ForwardItem
from laps_agent.engine.model.attention import EAGER_SDPA_BACKENDS, BlockAttention, PackedAttention
from laps_agent.engine.model.bucket_inputs import BucketInputs, build_bucket_inputs, pages_needed
from laps_agent.engine.model.cuda_graphs import BucketGraphs
from laps_agent.engine.model.kv_export import KVExport, start_export
from laps_agent.engine.model.loader import LoadedModel
from laps_agent.policy.scheduling.buckets import Bucket, BucketGrid, PaddingPlan, plan_padding


class ForwardError(ValueError):
    """The forward request is malformed (empty tokens, pages not covering the sequence...)."""


@dataclass
class ForwardStats:
    path: str               # "eager" | "bucket" | "graph"
    bucket: Bucket | None
    real_tokens: int
    padded_tokens: int


# Longest context a decode graph serves (its page-table width); see ModelRunner.__init__.
DECODE_GRAPH_MAX_CONTEXT = 4096


def decode_bucket(buckets: Sequence[Bucket], n: int) -> Bucket | None:
    """The smallest decode bucket (b, 1) holding n requests; None when n exceeds them all.
    `buckets` are sorted by batch size."""
    return next((b for b in buckets if b.batch_size >= n), None)


class ModelRunner:
    def __init__(self, loaded: LoadedModel, *, num_pages: int, page_size: int = 16,
                 grid: BucketGrid | None = None, cuda_graphs: bool | None = None,
                 graph_max_context: int | None = None,
                 decode_batch_sizes: Sequence[int] = (),
                 decode_graph_max_context: int = DECODE_GRAPH_MAX_CONTEXT):
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"num_pages and page_size must be >= 1, got {num_pages}, {page_size}")
        self.loaded = loaded
        self.model = loaded.model
        self.config = loaded.config
        self.page_size = page_size
        self.num_pages = num_pages
        self.scratch_page = num_pages
        self.grid = grid
        first = next(self.model.parameters())
        self.device = first.device
        self.dtype = first.dtype
        cfg = self.config
        shape = (cfg.num_layers, num_pages + 1, page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        if use_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs=True needs the model on a CUDA device")
        self.graphs = None
        pool = torch.cuda.graph_pool_handle() if use_graphs else None  # prefill and decode graphs'
        if use_graphs and grid is not None:
            max_context = graph_max_context or min(num_pages * page_size, grid.max_seq_len + 2048)
            self.graphs = BucketGraphs(self, max_pages=pages_needed(max_context, page_size), pool=pool)
        # Decode graphs read a page table as wide as the longest context they serve; longer
        # sequences decode eagerly (the fixed width is attention work for every slot).
        self.decode_buckets = [Bucket(b, 1) for b in sorted(set(decode_batch_sizes))]
        self.decode_graphs = None
        if use_graphs and self.decode_buckets:
            width = pages_needed(min(num_pages * page_size, decode_graph_max_context), page_size)
            self.decode_graphs = BucketGraphs(self, max_pages=width, pool=pool)

    # ------------------------------------------------------------------ public API
    def capture_graphs(self, progress: Callable[[int, int, Bucket], None] | None = None) -> list[Bucket]:
        """Capture the CUDA graph of every grid bucket and every decode batch size now (engine
        start-up) instead of on the request path; `progress(done, total, bucket)` after each.
        Returns the buckets captured; no-op without graphs (CPU)."""
        work = []
        if self.graphs is not None and self.grid is not None:
            work += [(self.graphs, b) for b in self.grid.buckets]
        if self.decode_graphs is not None:
            work += [(self.decode_graphs, b) for b in self.decode_buckets]
        with torch.inference_mode():
            for i, (graphs, bucket) in enumerate(work, 1):
                graphs.capture_all([bucket])
                if progress is not None:
                    progress(i, len(work), bucket)
        return [bucket for _, bucket in work]

    @torch.inference_mode()
    def forward(self, items: Sequence[ForwardItem], *, bucketed: bool = False
                ) -> tuple[torch.Tensor, ForwardStats]:
        self._validate(items)
        real = sum(len(it.token_ids) for it in items)
        bucket = self.grid.choose([len(it.token_ids) for it in items]) if bucketed and self.grid else None
        if bucket is None:
            return self._forward_eager(items), ForwardStats("eager", None, real, real)
        plan = plan_padding([len(it.token_ids) for it in items], bucket)
        if self.graphs is not None:
            logits = self.graphs.run(items, plan)
            if logits is not None:
                return logits, ForwardStats("graph", bucket, real, plan.padded_tokens)
        return self.forward_plan(items, plan), ForwardStats("bucket", bucket, real, plan.padded_tokens)

    @torch.inference_mode()
    def forward_decode(self, items: Sequence[ForwardItem]) -> tuple[torch.Tensor, ForwardStats]:
        """One decode step (one new token per item): a decode graph replay where one fits,
        else the eager path."""
        self._validate(items)
        n = len(items)
        bucket = decode_bucket(self.decode_buckets, n)
        if self.decode_graphs is not None and bucket is not None \
                and all(len(it.token_ids) == 1 for it in items):
            logits = self.decode_graphs.run(items, plan_padding([1] * n, bucket))
            if logits is not None:
                return logits, ForwardStats("graph", bucket, n, bucket.batch_size)
        return self._forward_eager(items), ForwardStats("eager", None, n, n)

    @torch.inference_mode()
    def forward_plan(self, items: Sequence[ForwardItem], plan: PaddingPlan) -> torch.Tensor:
        """Run a padded batch laid out by `plan` eagerly; logits at each real slot's last index.

        Public so tests can feed plans other than `plan_padding`'s (e.g. left-aligned ones)."""
        self._validate(items)
        width = max(pages_needed(it.start_pos + len(it.token_ids), self.page_size) for it in items)
        inputs = build_bucket_inputs(items, plan, page_size=self.page_size,
                                     scratch_page=self.scratch_page, width=width)
        inputs = BucketInputs(*(t.to(self.device) for t in vars(inputs).values()))
        with sdpa_kernel(EAGER_SDPA_BACKENDS):  # its page-table width varies with the cached prefix
            hidden = self.bucket_hidden(inputs, plan.bucket)
        last = torch.tensor([plan.last_index(i) for i in range(len(items))], device=self.device)
        return self.model.logits(hidden[last])

    def bucket_hidden(self, inputs: BucketInputs, bucket: Bucket) -> torch.Tensor:
        """Hidden states [B*S, hidden] of a padded batch; shared by the bucket and graph paths."""
        attention = BlockAttention(self.k_pool, self.v_pool, inputs.slots, inputs.page_table,
                                   inputs.kv_lens, bucket.batch_size, bucket.seq_len)
        return self.model.hidden_states(inputs.input_ids, inputs.positions, attention)

    def export_kv(self, pages: list[int], length: int) -> torch.Tensor:
        """CPU [layers, 2, length, kv_heads, head_dim] of a sequence's first `length` tokens."""
        return self.export_kv_async(pages, length).wait()

    @torch.inference_mode()
    def export_kv_async(self, pages: list[int], length: int) -> KVExport:
        """The same, with the device-to-host copy under way when this returns (kv_export.py):
        the pages may be freed at once; `wait()` off the engine loop."""
        self._check_pages(pages, length)
        idx = self._slots(pages, 0, length)
        layers, heads, dim = self.config.num_layers, *self.k_pool.shape[-2:]
        # One gather per pool, straight into the [layers, 2, ...] wire layout: indexing and then
        # torch.stack would copy the prompt's KV twice (on CPU this tensor is what goes out).
        out = torch.empty((layers, 2, length, heads, dim), dtype=self.k_pool.dtype, device=self.device)
        for j, pool in enumerate((self.k_pool, self.v_pool)):
            torch.index_select(pool.view(layers, -1, heads, dim), 1, idx, out=out[:, j])
        return start_export(out)

    @torch.inference_mode()
    def import_kv(self, pages: list[int], kv: torch.Tensor) -> None:
        cfg = self.config
        if kv.dim() != 5 or kv.shape[0] != cfg.num_layers or kv.shape[1] != 2 \
                or tuple(kv.shape[3:]) != (cfg.num_kv_heads, cfg.head_dim):
            raise ForwardError(f"kv shape {tuple(kv.shape)} does not match "
                               f"[{cfg.num_layers}, 2, length, {cfg.num_kv_heads}, {cfg.head_dim}]")
        length = kv.shape[2]
        self._check_pages(pages, length)
        idx = self._slots(pages, 0, length)
        # From pinned memory (kv_export.stage_import) the copy is queued, not waited for; the
        # scatters below follow it on the same stream.
        kv = kv.to(device=self.device, dtype=self.dtype, non_blocking=True)
        self.k_pool.view(cfg.num_layers, -1, *self.k_pool.shape[-2:])[:, idx] = kv[:, 0]
        self.v_pool.view(cfg.num_layers, -1, *self.v_pool.shape[-2:])[:, idx] = kv[:, 1]

    # ------------------------------------------------------------------ internals
    def _forward_eager(self, items: Sequence[ForwardItem]) -> torch.Tensor:
        dev = self.device
        ids, positions, slots, offsets, tables, kv_lens, decode_rows = [], [], [], [0], [], [], []
        for i, item in enumerate(items):
            n = len(item.token_ids)
            ids.extend(item.token_ids)
            positions.extend(range(item.start_pos, item.start_pos + n))
            slots.append(self._slots(item.pages, item.start_pos, n))
            offsets.append(offsets[-1] + n)
            kv_len = item.start_pos + n
            kv_lens.append(kv_len)
            tables.append(torch.tensor(item.pages[:pages_needed(kv_len, self.page_size)], device=dev))
            if n == 1:
                decode_rows.append(i)
        decode_table = decode_lens = None
        if decode_rows:
            width = max(len(tables[i]) for i in decode_rows)
            decode_table = torch.full((len(decode_rows), width), self.scratch_page, dtype=torch.long, device=dev)
            for row, i in enumerate(decode_rows):
                decode_table[row, :len(tables[i])] = tables[i]
            decode_lens = torch.tensor([kv_lens[i] for i in decode_rows], device=dev)
        attention = PackedAttention(self.k_pool, self.v_pool, torch.cat(slots).to(dev), offsets, tables,
                                    kv_lens, decode_rows, decode_table, decode_lens)
        with sdpa_kernel(EAGER_SDPA_BACKENDS):
            hidden = self.model.hidden_states(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev),
                                              attention)
        last = torch.tensor([o - 1 for o in offsets[1:]], device=dev)
        return self.model.logits(hidden[last])

    def _slots(self, pages: list[int], start: int, count: int) -> torch.Tensor:
        pos = torch.arange(start, start + count)
        page_ids = torch.tensor(pages, dtype=torch.long)[pos // self.page_size]
        return (page_ids * self.page_size + pos % self.page_size).to(self.device)

    def _check_pages(self, pages: Sequence[int], length: int) -> None:
        if length < 0:
            raise ForwardError(f"length must be >= 0, got {length}")
        need = pages_needed(length, self.page_size)
        if len(pages) < need:
            raise ForwardError(f"{len(pages)} pages cannot hold {length} tokens "
                               f"(page_size {self.page_size} needs {need})")
        bad = [p for p in pages[:need] if not 0 <= p < self.num_pages]
        if bad:
            raise ForwardError(f"page ids {bad[:5]} out of range 0..{self.num_pages - 1}")

    def _validate(self, items: Sequence[ForwardItem]) -> None:
        if not items:
            raise ForwardError("forward needs at least one item")
        vocab = self.config.vocab_size
        for i, item in enumerate(items):
            if not item.token_ids:
                raise ForwardError(f"item {i}: token_ids is empty")
            if item.start_pos < 0:
                raise ForwardError(f"item {i}: start_pos must be >= 0, got {item.start_pos}")
            if min(item.token_ids) < 0 or max(item.token_ids) >= vocab:
                raise ForwardError(f"item {i}: token ids must be in 0..{vocab - 1}")
            try:
                self._check_pages(item.pages, item.start_pos + len(item.token_ids))
            except ForwardError as err:
                raise ForwardError(f"item {i}: {err}") from None
