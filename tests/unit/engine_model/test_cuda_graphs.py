"""The CUDA-graph bucket path against the eager path (GPU only; skipped elsewhere)."""
from __future__ import annotations

import pytest
import torch

from laps_agent.engine.loader import load_model
from laps_agent.engine.runner import ForwardItem, ModelRunner
from laps_agent.scheduling.buckets import BucketGrid

PAGE = 4
# fp32 on GPU: cuBLAS/SDPA kernels differ between batch shapes; TF32 stays off for matmuls.
ATOL = 1e-3


def test_cuda_graphs_need_a_cuda_device(tiny_loaded):
    with pytest.raises(ValueError, match="CUDA"):
        ModelRunner(tiny_loaded, num_pages=8, page_size=PAGE, grid=BucketGrid([1], [8]), cuda_graphs=True)


def _pages(first: int, tokens: int) -> list[int]:
    return list(range(first, first + -(-tokens // PAGE)))


def test_static_buffer_replays_match_eager_on_cpu(tiny_loaded):
    """Everything of the graph path but the capture: fixed-width page tables, in-place buffer
    updates, static last-position logits, reuse of one bucket's buffers for a second batch."""
    from laps_agent.engine.cuda_graphs import BucketGraphs
    from laps_agent.scheduling.buckets import plan_padding

    grid = BucketGrid([4], [16])
    runner = ModelRunner(tiny_loaded, num_pages=128, page_size=PAGE, grid=grid)
    graphs = BucketGraphs(runner, max_pages=16)
    eager = ModelRunner(tiny_loaded, num_pages=128, page_size=PAGE)
    tok = tiny_loaded.tokenizer
    for texts in (["Hello world!", "What is the capital of France?", "The quick brown fox"],
                  ["Kubernetes runs pods.", "0123456789"]):
        prompts = [tok.encode(t) for t in texts]
        items = [ForwardItem(ids, 0, _pages(16 * i, len(ids))) for i, ids in enumerate(prompts)]
        logits = graphs.run(items, plan_padding([len(p) for p in prompts], grid.choose([len(p) for p in prompts])))
        want = torch.cat([eager.forward([ForwardItem(ids, 0, _pages(0, len(ids)))])[0] for ids in prompts])
        assert (logits - want).abs().max().item() <= 1e-4
    assert list(graphs.captured) == [grid.buckets[0]]
    too_long = [ForwardItem([5], 16 * PAGE, _pages(0, 16 * PAGE + 1))]
    assert graphs.run(too_long, plan_padding([1], grid.buckets[0])) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replays_match_eager_prefill(tiny_model_dir):
    loaded = load_model(tiny_model_dir, device="cuda")
    grid = BucketGrid([1, 2, 4], [16, 32])
    runner = ModelRunner(loaded, num_pages=128, page_size=PAGE, grid=grid, graph_max_context=64)
    assert runner.capture_graphs() == grid.buckets
    eager = ModelRunner(loaded, num_pages=128, page_size=PAGE)
    tok = loaded.tokenizer
    batches = [
        ["Hello world!", "What is the capital of France?", "The quick brown fox"],
        ["Kubernetes runs the prefill and decode engines as pods.", "0123456789"],  # same graphs, new data
    ]
    for texts in batches:
        prompts = [tok.encode(t) for t in texts]
        items = [ForwardItem(ids, 0, _pages(16 * i, len(ids))) for i, ids in enumerate(prompts)]
        logits, stats = runner.forward(items, bucketed=True)
        assert stats.path == "graph"
        want = torch.cat([eager.forward([ForwardItem(ids, 0, _pages(0, len(ids)))])[0] for ids in prompts])
        assert (logits - want).abs().max().item() <= ATOL
        for it in items:  # the graph wrote the real pages
            n = len(it.token_ids)
            eager.forward([ForwardItem(it.token_ids, 0, it.pages)])
            assert torch.allclose(runner.export_kv(it.pages, n), eager.export_kv(it.pages, n), atol=ATOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cached_prefix_beyond_graph_page_table_falls_back_to_eager_bucket(tiny_model_dir):
    loaded = load_model(tiny_model_dir, device="cuda")
    runner = ModelRunner(loaded, num_pages=128, page_size=PAGE, grid=BucketGrid([1], [16]),
                         graph_max_context=32)
    ids = list(range(3, 60))
    pages = _pages(0, len(ids))
    runner.forward([ForwardItem(ids[:50], 0, pages)])
    logits, stats = runner.forward([ForwardItem(ids[50:], 50, pages)], bucketed=True)
    assert stats.path == "bucket"
    full = ModelRunner(loaded, num_pages=128, page_size=PAGE).forward([ForwardItem(ids, 0, pages)])[0]
    assert (logits - full).abs().max().item() <= ATOL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_engine_start_up_captures_every_bucket_and_sizes_kv_from_memory(tiny_model_dir):
    """`laps engine` on CUDA: every bucket's graph is captured while starting (not on the request
    path), and the KV pool takes --mem-fraction of the free memory."""
    from laps_agent.engine.cli import build, build_parser

    args = build_parser().parse_args(["--model", str(tiny_model_dir), "--device", "cuda",
                                      "--batch-prefill-batch-sizes", "1,2", "--batch-prefill-seq-lengths", "16,32",
                                      "--mem-fraction", "0.05", "--labels-file", "/nonexistent"])
    _, engine = build(args)
    graphs = engine.runner.graphs
    assert graphs is not None and len(graphs.captured) == 4
    assert engine.kv.num_pages > 2 * 4096 // 16  # far more than the CPU default on any GPU
