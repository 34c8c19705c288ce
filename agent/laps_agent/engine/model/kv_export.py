"""A prompt's KV between the device and host memory, without blocking the engine loop.

Export (prefill side):
The engine loop gathers the sequence's pages into a fresh device tensor (an ordinary kernel,
queued like any other) and starts the device-to-host copy into pinned memory; it then frees the
pages and goes on with the next batch. Reusing the freed pages is safe: later kernels run after
the gather on the same stream. Whoever serialises the KV for the decode engine calls `wait()`,
off the engine loop (the codec runs in a worker thread). On CPU the gather is already host
memory and `wait()` returns at once, so CPU and GPU share every line but the copy.

Import (decode side): the received KV is staged into pinned memory by the codec's worker thread
(`stage_import`), so the engine loop's host-to-device copy is queued on its stream
(non_blocking) instead of waiting for a pageable copy, and the scatter into the pool follows it
there. The pinned block is not reused before that copy ran (PyTorch's pinned-memory allocator
records it), so the loop may drop the host tensor at once. On CPU staging returns the tensor
itself and the scatter into the pool is the copy."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVExport:
    host: torch.Tensor                          # [layers, 2, length, kv_heads, head_dim]
    ready: torch.cuda.Event | None = None       # recorded after the copy; None: already there

    def wait(self) -> torch.Tensor:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host


def start_export(gathered: torch.Tensor) -> KVExport:
    """Start moving `gathered` (a tensor no one else writes) to host memory."""
    if gathered.device.type != "cuda":
        return KVExport(gathered)
    host = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
    host.copy_(gathered, non_blocking=True)
    ready = torch.cuda.Event(blocking=True)  # wait() sleeps in its thread instead of spinning a core
    ready.record()
    return KVExport(host, ready)


def resolve(kv: torch.Tensor | KVExport) -> torch.Tensor:
    """The host tensor of `kv`, waiting for its copy if one is under way."""
    return kv.wait() if isinstance(kv, KVExport) else kv


def stage_import(kv: torch.Tensor, device: torch.device | str | None,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
    """Off the engine loop: `kv` (host memory) ready for a non-blocking copy into a pool of
    `dtype` on `device`. A KV of another dtype (the prefill engine runs another --dtype) is
    converted here: converting in the copy would do it on the host, on the loop, and from
    pageable memory."""
    if device is None or torch.device(device).type != "cuda":
        return kv
    if dtype is not None and kv.dtype != dtype:
        kv = kv.to(dtype)
    return kv if kv.is_pinned() else kv.pin_memory()
