"""The CUDA-graph bucket path against the eager path (GPU only; skipped elsewhere)."""
from __future__ import annotations

import pytest
import torch

from laps_agent.engine.model.loader import load_model
from laps_agent.engine.model.runner import ForwardItem, ModelRunner
from laps_agent.policy.scheduling.buckets import BucketGrid

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
    from laps_agent.engine.model.cuda_graphs import BucketGraphs
    from laps_agent.policy.scheduling.buckets import plan_padding

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
@pytest.mark.parametrize("role,prefill_graphs,decode_graphs", [("mixed", 4, 2), ("prefill", 4, 0), ("decode", 0, 2)])
def test_engine_start_up_captures_its_roles_graphs_and_sizes_kv_from_memory(tiny_model_dir, role,
                                                                           prefill_graphs, decode_graphs):
    """`laps engine` on CUDA: the graphs its role runs are captured while starting (not on the
    request path): every prefill bucket unless it is a decode engine, the decode grid unless it
    is a prefill engine; the KV pool takes --mem-fraction of the free memory."""
    from laps_agent.engine.cli import build, build_parser

    args = build_parser().parse_args(["--model", str(tiny_model_dir), "--device", "cuda", "--role", role,
                                      "--batch-prefill-graphs-batch-sizes", "1,2", "--batch-prefill-graphs-seq-lengths", "16,32",
                                      "--decode-graph-batch-sizes", "1,2", "--mem-fraction", "0.05",
                                      "--labels-file", "/nonexistent"])
    _, engine = build(args)
    runner = engine.runner
    assert (len(runner.graphs.captured) if runner.graphs else 0) == prefill_graphs
    assert (len(runner.decode_graphs.captured) if runner.decode_graphs else 0) == decode_graphs
    assert engine.kv.num_pages > 2 * 4096 // 16  # far more than the CPU default on any GPU


def _decode_items(runner: ModelRunner, prompts: list[list[int]], steps: int = 1) -> list[ForwardItem]:
    """Prefill each prompt eagerly into its own pages, with room for `steps` decode steps; the
    first decode step's items (one new token)."""
    items = []
    for i, ids in enumerate(prompts):
        pages = _pages(16 * i, len(ids) + steps)
        runner.forward([ForwardItem(ids, 0, pages)])
        items.append(ForwardItem([ids[-1]], len(ids), pages))
    return items


def test_decode_step_in_a_padded_decode_bucket_matches_eager_on_cpu(tiny_loaded):
    """A decode batch of 3 run as the (4, 1) bucket on the graph path's fixed buffers (all but
    the capture), against the eager decode step; a second batch reuses the same buffers."""
    from laps_agent.engine.model.cuda_graphs import BucketGraphs
    from laps_agent.engine.model.runner import decode_bucket
    from laps_agent.policy.scheduling.buckets import Bucket, plan_padding

    runner = ModelRunner(tiny_loaded, num_pages=128, page_size=PAGE)
    eager = ModelRunner(tiny_loaded, num_pages=128, page_size=PAGE)
    graphs = BucketGraphs(runner, max_pages=16)
    buckets = [Bucket(1, 1), Bucket(2, 1), Bucket(4, 1)]
    tok = tiny_loaded.tokenizer
    for texts in (["Hello world!", "What is the capital of France?", "The quick brown fox"],
                  ["Kubernetes runs pods.", "0123456789"]):
        prompts = [tok.encode(t) for t in texts]
        items = _decode_items(runner, prompts)
        want = eager.forward_decode(_decode_items(eager, prompts))
        assert want[1].path == "eager"  # no decode graphs off CUDA
        bucket = decode_bucket(buckets, len(items))
        logits = graphs.run(items, plan_padding([1] * len(items), bucket))
        assert logits.shape[0] == len(items)
        assert (logits - want[0]).abs().max().item() <= 1e-4
    assert sorted(b.batch_size for b in graphs.captured) == [2, 4]
    assert decode_bucket(buckets, 5) is None  # wider than the grid: the eager path takes it


def test_decode_graph_sizes_stop_at_the_running_bound():
    from laps_agent.engine.cli import build_parser, decode_graph_sizes

    args = build_parser().parse_args([])
    assert decode_graph_sizes(args, 32) == [1, 2, 4, 8, 16, 32]
    assert decode_graph_sizes(args, 6) == [1, 2, 4, 8]
    assert decode_graph_sizes(build_parser().parse_args(["--no-decode-graphs"]), 32) == []


def test_each_role_captures_only_the_graphs_it_replays():
    """A PD decode engine never prefills (its KV is imported) and a PD prefill engine never
    decodes (it hands off after the first token): neither pays start-up time and device memory
    for graphs it would never replay; a mixed engine takes both."""
    from laps_agent.engine.cli import graphs_for_role

    grid, sizes = BucketGrid([1, 2], [16, 32]), [1, 2, 4]
    assert graphs_for_role("mixed", grid, sizes) == (grid, sizes)
    assert graphs_for_role("prefill", grid, sizes) == (grid, [])
    assert graphs_for_role("decode", grid, sizes) == (None, sizes)


def test_kv_export_started_on_the_loop_is_the_same_kv_when_collected(tiny_loaded):
    runner = ModelRunner(tiny_loaded, num_pages=32, page_size=PAGE)
    ids = tiny_loaded.tokenizer.encode("The hand-off copies this prompt's KV to the decode engine.")
    pages = _pages(0, len(ids))
    runner.forward([ForwardItem(ids, 0, pages)])
    pending = runner.export_kv_async(pages, len(ids))
    assert torch.equal(pending.wait(), runner.export_kv(pages, len(ids)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decode_graphs_captured_at_start_up_replay_like_eager(tiny_model_dir):
    loaded = load_model(tiny_model_dir, device="cuda")
    runner = ModelRunner(loaded, num_pages=128, page_size=PAGE, decode_batch_sizes=[1, 2, 4],
                         decode_graph_max_context=64)
    captured = runner.capture_graphs()
    assert [b.batch_size for b in captured] == [1, 2, 4] and runner.graphs is None
    eager = ModelRunner(loaded, num_pages=128, page_size=PAGE)
    tok = loaded.tokenizer
    prompts = [tok.encode(t) for t in ("Hello world!", "What is the capital of France?", "abc")]
    items, want_items = _decode_items(runner, prompts, steps=4), _decode_items(eager, prompts, steps=4)
    for _ in range(4):  # several steps: the graph writes the real pages each time
        logits, stats = runner.forward_decode(items)
        want, _ = eager.forward_decode(want_items)
        assert stats.path == "graph" and stats.bucket.batch_size == 4
        assert (logits - want).abs().max().item() <= ATOL
        nxt = want.argmax(-1).tolist()
        items = [ForwardItem([t], it.start_pos + 1, it.pages) for t, it in zip(nxt, items)]
        want_items = [ForwardItem([t], it.start_pos + 1, it.pages) for t, it in zip(nxt, want_items)]
    long_item = [ForwardItem([5], 70, _pages(0, 71))]  # beyond the graphs' page table
    assert runner.forward_decode(long_item)[1].path == "eager"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kv_export_on_cuda_does_not_wait_for_the_copy(tiny_model_dir):
    loaded = load_model(tiny_model_dir, device="cuda")
    runner = ModelRunner(loaded, num_pages=64, page_size=PAGE)
    ids = list(range(3, 120))
    pages = _pages(0, len(ids))
    runner.forward([ForwardItem(ids, 0, pages)])
    pending = runner.export_kv_async(pages, len(ids))
    assert pending.ready is not None and pending.host.is_pinned()
    host = pending.wait()
    assert host.device.type == "cpu"
    runner.k_pool.zero_()  # the pages are free for reuse: the exported copy keeps its values
    assert torch.equal(host, pending.wait()) and host.abs().sum() > 0


def _kv_round_trip(device: str, tiny_model_dir, tiny_loaded=None) -> None:
    """Prefill on one runner, export, stage as the decode side's codec does, import into a
    second runner's pool at other pages: that pool then holds the same KV."""
    from laps_agent.engine.model.kv_export import stage_import

    loaded = tiny_loaded if tiny_loaded is not None else load_model(tiny_model_dir, device=device)
    prefill = ModelRunner(loaded, num_pages=64, page_size=PAGE)
    decode = ModelRunner(loaded, num_pages=64, page_size=PAGE)
    ids = loaded.tokenizer.encode("The decode engine imports this prompt's KV into its own pool.")
    pages = _pages(0, len(ids))
    prefill.forward([ForwardItem(ids, 0, pages)])
    sent = prefill.export_kv(pages, len(ids))
    wire = sent.float()  # what a prefill engine of another --dtype would send
    staged = stage_import(wire.clone(), device, decode.dtype)
    assert staged.is_pinned() == (device == "cuda")
    if device == "cuda":  # converted off the loop, into what the pool holds
        assert staged.dtype == decode.dtype
    other = _pages(20, len(ids))
    decode.import_kv(other, staged)
    del staged  # the engine loop drops the host copy at once
    assert torch.equal(decode.export_kv(other, len(ids)), sent)


def test_kv_import_staged_on_cpu_fills_the_pool(tiny_loaded, tiny_model_dir):
    _kv_round_trip("cpu", tiny_model_dir, tiny_loaded)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kv_import_on_cuda_is_staged_pinned_and_fills_the_pool(tiny_model_dir):
    _kv_round_trip("cuda", tiny_model_dir)
