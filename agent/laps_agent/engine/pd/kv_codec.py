"""The builtin engine's KV codec: prompt KV tensors over the bootstrap wire (pd_wire).

The KV is the big part of a hand-off (46 KB a token for SmolLM2-135M in fp32), so it is copied
as little as possible: the engine gathers it once, straight into its wire layout (runner.py);
`frame()` ships that tensor's memory as the frame body, which the bootstrap port writes to the
socket as it is; the decode side reads the body into one aligned buffer (pd_wire.fetch_payload)
and `decode` views the tensor in place. What remains is the copy into the decode engine's pool."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch

from laps_agent.engine.model.kv_export import KVExport, resolve, stage_import
from laps_agent.engine.pd.wire import BootstrapError, Frame, decode_frame

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class KVTransfer:
    room: int
    input_ids: list[int]
    first_token: int
    kv: torch.Tensor                        # CPU [layers, 2, len(input_ids), kv_heads, head_dim]
    meta: dict = field(default_factory=dict)

    def frame(self) -> Frame:
        """The wire frame, its body a view of the KV's memory (no copy when the KV is a
        contiguous CPU tensor, as export_kv makes it). The frame keeps that memory alive."""
        kv = self.kv.detach().to("cpu").contiguous()
        dtype = str(kv.dtype).removeprefix("torch.")
        header = {"room": self.room, "input_ids": self.input_ids, "first_token": self.first_token,
                  "shape": list(kv.shape), "dtype": dtype, "meta": self.meta}
        # The raw native-order bytes, as .numpy().tobytes() gave them; a uint8 view works for
        # bfloat16 too, which has no numpy dtype.
        return Frame(header, kv.reshape(-1).view(torch.uint8).numpy())

    def encode(self) -> bytes:
        return bytes(self.frame())

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview | Frame) -> "KVTransfer":
        """Views the KV in `data` when it is writable and aligned (what fetch_payload returns),
        so the transfer shares its memory; copies it otherwise."""
        header, body = decode_frame(bytes(data) if isinstance(data, Frame) else data)
        try:
            dtype = _DTYPES[header["dtype"]]
            shape = [int(d) for d in header["shape"]]
            raw = _writable_bytes(body)
            if raw.data_ptr() % dtype.itemsize:  # torch views need element-aligned data
                raw = raw.clone()
            kv = raw.view(dtype).reshape(shape)
        except (ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise BootstrapError(f"corrupt KV transfer payload: {exc}") from None
        if kv.dim() != 5:
            raise BootstrapError(f"corrupt KV transfer payload: shape {shape} is not 5-D")
        if kv.shape[2] != len(header["input_ids"]):
            raise BootstrapError("KV length does not match the prompt length")
        return cls(room=int(header["room"]), input_ids=list(header["input_ids"]),
                   first_token=int(header["first_token"]), kv=kv, meta=header.get("meta", {}))


def _writable_bytes(body: memoryview) -> torch.Tensor:
    """A uint8 tensor over `body`: in place when writable (torch warns on, and may not write
    to, read-only memory), else a copy."""
    if len(body) == 0:
        return torch.empty(0, dtype=torch.uint8)
    if body.readonly:
        return torch.frombuffer(bytearray(body), dtype=torch.uint8)
    return torch.frombuffer(body, dtype=torch.uint8)


class TensorKVCodec:
    """KVCodec of the builtin engine; waiting for the KV and the decode copies run off the
    event loop. `device`, `dtype`: the decode engine's pool, into which received KV goes
    (kv_export: staged in pinned memory for CUDA)."""

    def __init__(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        self.device, self.dtype = device, dtype

    async def encode(self, room: int, input_ids: list[int], first_token: int,
                     kv: torch.Tensor | KVExport, meta: dict | None = None) -> Frame:
        def run() -> Frame:  # waits for the engine's device-to-host copy here, not on its loop
            return KVTransfer(room=room, input_ids=list(input_ids), first_token=first_token,
                              kv=resolve(kv), meta=dict(meta or {})).frame()

        return await asyncio.to_thread(run)

    async def decode(self, payload: bytes | memoryview) -> "KVTransfer":
        def run() -> KVTransfer:
            transfer = KVTransfer.decode(payload)
            transfer.kv = stage_import(transfer.kv, self.device, self.dtype)
            return transfer

        return await asyncio.to_thread(run)
