"""What the engine core asks of a model runner (torch-free): the items of a forward pass, and the
runner's interface as the core uses it. The torch runner (engine/model/runner.py) implements it;
the core never imports it, so the scheduling core stays importable and testable without torch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence


@dataclass
class ForwardItem:
    token_ids: list[int]    # tokens computed now (uncached suffix; 1 token for decode)
    start_pos: int          # tokens already in this sequence's KV = position of token_ids[0]
    pages: list[int]        # KV page ids covering positions [0, start_pos + len(token_ids))


class Runner(Protocol):
    """The model side of one engine, as EngineCore drives it. `forward` returns (logits, stats):
    the logits go only to the core's sampler, the stats (`path`, `real_tokens`, `padded_tokens`)
    into the batch's PrefillRecord. `graphs`: not None when prefill buckets replay CUDA graphs."""

    num_pages: int
    page_size: int
    graphs: Any

    def forward(self, items: Sequence[ForwardItem], *, bucketed: bool = False) -> tuple[Any, Any]: ...

    def forward_decode(self, items: Sequence[ForwardItem]) -> tuple[Any, Any]: ...

    def export_kv_async(self, pages: list[int], length: int) -> Any: ...

    def import_kv(self, pages: list[int], kv: Any) -> None: ...


# One next token per row of `logits`, or the exception of a row that cannot be sampled:
# (logits, sampling params per row, tokens generated so far per row) -> tokens.
Sampler = Callable[[Any, Sequence[Any], Sequence[int]], list]
