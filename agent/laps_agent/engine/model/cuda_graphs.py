"""CUDA graphs for the batch-prefill buckets.

One graph per bucket, captured on first use (or all at once by `capture_all`). Each graph reads
its inputs from preallocated buffers with stable addresses (token ids, positions, KV write slots,
page table, KV lengths); a run fills them in place from `build_bucket_inputs` (the same function
the eager bucket path uses) and replays. Right alignment puts every slot's last real token at the
slot's last position, so the logits rows are static too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from laps_agent.engine.core.forward import ForwardItem
from laps_agent.engine.model.bucket_inputs import BucketInputs, build_bucket_inputs
from laps_agent.policy.scheduling.buckets import Bucket, PaddingPlan, plan_padding


class GraphedRunner(Protocol):
    """What the graphs use of their runner (runner.py's ModelRunner): its KV layout, its device
    and the forward pass of a padded batch (`bucket_hidden`, shared with the eager bucket path)."""

    page_size: int
    scratch_page: int
    device: torch.device
    model: Any

    def bucket_hidden(self, inputs: BucketInputs, bucket: Bucket) -> torch.Tensor: ...


@dataclass
class _CapturedBucket:
    graph: torch.cuda.CUDAGraph | None   # None off CUDA: `compute` runs on the same buffers
    inputs: BucketInputs                 # of device buffers
    logits: torch.Tensor                 # [B, vocab] output buffer
    compute: Callable[[], torch.Tensor]

    def replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.logits.copy_(self.compute())


class BucketGraphs:
    """Static-buffer bucket runs; CUDA graphs on a CUDA device. Off CUDA the same buffers and
    replay logic run eagerly, which lets CPU tests check everything but the capture itself."""

    def __init__(self, runner: GraphedRunner, *, max_pages: int, pool=None):
        """`pool`: a graph memory pool (torch.cuda.graph_pool_handle()) shared with other
        BucketGraphs of the runner: every graph replays on the engine's one stream and its
        output is cloned at once, so one pool serves the prefill and the decode graphs."""
        self.runner = runner
        self.max_pages = max_pages  # page-table width of every graph
        self.captured: dict[Bucket, _CapturedBucket] = {}
        self.use_graphs = runner.device.type == "cuda"
        if self.use_graphs and pool is None:
            pool = torch.cuda.graph_pool_handle()
        self._pool = pool if self.use_graphs else None

    @torch.inference_mode()
    def run(self, items: Sequence[ForwardItem], plan: PaddingPlan) -> torch.Tensor | None:
        """Logits [len(items), vocab], or None when the batch needs a wider page table."""
        runner = self.runner
        needed = max(-(-(it.start_pos + len(it.token_ids)) // runner.page_size) for it in items)
        if needed > self.max_pages:
            return None
        captured = self.captured.get(plan.bucket) or self._capture(plan.bucket)
        host = build_bucket_inputs(items, plan, page_size=runner.page_size,
                                   scratch_page=runner.scratch_page, width=self.max_pages)
        for name, value in vars(host).items():
            getattr(captured.inputs, name).copy_(value, non_blocking=True)
        captured.replay()
        return captured.logits[:len(items)].clone()

    def capture_all(self, buckets: Sequence[Bucket]) -> None:
        for bucket in buckets:
            if bucket not in self.captured:
                self._capture(bucket)

    @torch.inference_mode()
    def _capture(self, bucket: Bucket) -> _CapturedBucket:
        runner = self.runner
        # Capture with an all-dummy batch: every write goes to the scratch page.
        dummy = plan_padding([1], bucket)
        host = build_bucket_inputs([ForwardItem([0], 0, [runner.scratch_page])], dummy,
                                   page_size=runner.page_size, scratch_page=runner.scratch_page,
                                   width=self.max_pages)
        host.slots.fill_(runner.scratch_page * runner.page_size)
        host.page_table.fill_(runner.scratch_page)
        host.kv_lens.fill_(1)
        inputs = BucketInputs(*(t.to(runner.device) for t in vars(host).values()))
        b, s = bucket.batch_size, bucket.seq_len

        def compute() -> torch.Tensor:
            hidden = runner.bucket_hidden(inputs, bucket).view(b, s, -1)
            return runner.model.logits(hidden[:, -1])

        if not self.use_graphs:
            captured = _CapturedBucket(None, inputs, compute(), compute)
            self.captured[bucket] = captured
            return captured
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy kernels and allocator state before capture
                compute()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a capture forbids unsafe CUDA calls of this thread only, so the codec's
        # worker threads (pinned staging of KV) are not failed by a capture under way.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits = compute()
        captured = _CapturedBucket(graph, inputs, logits, compute)
        self.captured[bucket] = captured
        return captured
