"""The builtin engine's KV codec: prompt KV tensors over the bootstrap wire (pd_wire)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
import torch

from laps_agent.engine.kv_export import KVExport, resolve
from laps_agent.engine.pd_wire import (BootstrapError, KVOutbox, bootstrap_app,  # noqa: F401
                                       decode_frame, encode_frame, fetch_payload)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class KVTransfer:
    room: int
    input_ids: list[int]
    first_token: int
    kv: torch.Tensor                        # CPU [layers, 2, len(input_ids), kv_heads, head_dim]
    meta: dict = field(default_factory=dict)

    def encode(self) -> bytes:
        kv = self.kv.detach().to("cpu").contiguous()
        dtype = str(kv.dtype).removeprefix("torch.")
        header = {"room": self.room, "input_ids": self.input_ids, "first_token": self.first_token,
                  "shape": list(kv.shape), "dtype": dtype, "meta": self.meta}
        # bfloat16 has no numpy dtype: ship its bits as int16.
        body = kv.view(torch.int16).numpy().tobytes() if dtype == "bfloat16" else kv.numpy().tobytes()
        return encode_frame(header, body)

    @classmethod
    def decode(cls, data: bytes) -> "KVTransfer":
        header, body = decode_frame(data)
        try:
            dtype = _DTYPES[header["dtype"]]
            payload = bytearray(body)
            flat = torch.frombuffer(payload, dtype=torch.int16 if dtype == torch.bfloat16 else dtype)
            kv = flat.view(dtype).reshape(header["shape"])
        except (ValueError, KeyError, RuntimeError, TypeError) as exc:
            raise BootstrapError(f"corrupt KV transfer payload: {exc}") from None
        if kv.shape[2] != len(header["input_ids"]):
            raise BootstrapError("KV length does not match the prompt length")
        return cls(room=int(header["room"]), input_ids=list(header["input_ids"]),
                   first_token=int(header["first_token"]), kv=kv, meta=header.get("meta", {}))


class TensorKVCodec:
    """KVCodec of the builtin engine; the (de)serialisation copies run off the event loop."""

    async def encode(self, room: int, input_ids: list[int], first_token: int,
                     kv: torch.Tensor | KVExport, meta: dict | None = None) -> bytes:
        def run() -> bytes:  # waits for the engine's device-to-host copy here, not on its loop
            return KVTransfer(room=room, input_ids=list(input_ids), first_token=first_token,
                              kv=resolve(kv), meta=dict(meta or {})).encode()

        return await asyncio.to_thread(run)

    async def decode(self, payload: bytes) -> "KVTransfer":
        return await asyncio.to_thread(KVTransfer.decode, payload)


async def fetch_kv(host: str, port: int, room: int, timeout_s: float, *,
                   client: httpx.AsyncClient | None = None, poll_s: float = 5.0) -> KVTransfer:
    """Decode side: long-poll the prefill engine until the room's KV arrives or timeout_s passes."""
    payload = await fetch_payload(host, port, room, timeout_s, client=client, poll_s=poll_s)
    transfer = await asyncio.to_thread(KVTransfer.decode, payload)  # big copy: off the loop
    if transfer.room != room:
        raise BootstrapError(f"asked for room {room}, got {transfer.room}")
    return transfer
