"""The key/value metadata of a GGUF file (the tokenizer's vocabulary, merges, template, ...)
and its tensor table, in about 1/20 of the time `gguf.GGUFReader` takes.

Why not GGUFReader: it builds two numpy views per array element, so SmolLM2's 49,152 tokens
and 48,900 merges took about 2 s of CPU in every process that only wanted the tokenizer (each
emulated engine, each gateway, `laps local`, `laps bench run`) and in every builtin engine
before its weights. This reads the same section
(GGUF versions 2 and 3, either byte order, as GGUFReader does) with `struct` over an mmap and
returns what `ReaderField.contents()` gives: str, int, float, bool, and lists of them; an array
of arrays comes back flat, as there. A test holds the two equal.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

GGUF_MAGIC = b"GGUF"
NOT_GGUF = "GGUF magic invalid"   # gguf.GGUFReader's words, as laps said before this module
VERSIONS = (2, 3)                 # as GGUFReader reads (version 1 had 32-bit counts)
MAX_NESTING = 8                   # arrays of arrays: a hostile file must not exhaust the stack

# GGUF value types: id -> struct format of one item (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_UINT32, _STRING, _ARRAY = 4, 8, 9
DEFAULT_ALIGNMENT = 32             # of the tensor data, unless general.alignment says otherwise
ALIGNMENT_KEY = "general.alignment"


class GGUFFormatError(ValueError):
    """The file is not a GGUF this reader understands (the message says what is wrong)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]   # as the file lists them: innermost first
    ggml_type: int          # gguf.GGMLQuantizationType's value
    offset: int             # of its data from the start of the file


@dataclass(frozen=True)
class GGUFLayout:
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    little_endian: bool     # the byte order of every number in the file, tensor data included


def read_gguf_layout(path: str | Path, wanted: Callable[[str], bool] | None = None) -> GGUFLayout:
    """What GGUFReader's `fields` and `tensors` describe, without the data (the caller maps the
    file: TensorInfo.offset is from its start); `wanted` as for read_gguf_metadata."""
    return _read(path, wanted, tensors=True)


def read_gguf_metadata(path: str | Path, wanted: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """{key: value} of the file's metadata, as GGUFReader's `field.contents()` gives them
    (without its own `GGUF.*` entries). `wanted(key)`: only those keys (the others are skipped
    undecoded, so a stray byte in an unrelated string does not matter)."""
    return _read(path, wanted, tensors=False).metadata


def _read(path: str | Path, wanted: Callable[[str], bool] | None, tensors: bool) -> GGUFLayout:
    """The metadata and, if `tensors`, the tensor table (a tokenizer's read stops before it)."""
    with open(path, "rb") as f:
        if f.seek(0, 2) < 4:   # mmap refuses an empty file
            raise GGUFFormatError(NOT_GGUF)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            reader = _Reader(data, wanted or (lambda key: True))
            metadata = reader.metadata()
            return GGUFLayout(metadata, reader.tensor_infos() if tensors else [], reader.order == "<")


class _Reader:
    def __init__(self, data: mmap.mmap, wanted: Callable[[str], bool]) -> None:
        self.data, self.wanted, self.offset, self.order = data, wanted, 0, "<"
        self.alignment = DEFAULT_ALIGNMENT

    def metadata(self) -> dict[str, Any]:
        if self.data[:4] != GGUF_MAGIC:
            raise GGUFFormatError(NOT_GGUF)
        self.offset = 4
        version = self._scalar("I")
        if version & 0xFFFF == 0:   # written on a machine of the other byte order (as GGUFReader tells)
            self.order, version = ">", struct.unpack("<I", struct.pack(">I", version))[0]
        if version not in VERSIONS:
            raise GGUFFormatError(f"GGUF version {version} is not supported (only {VERSIONS[0]} and {VERSIONS[1]})")
        self.tensor_count, count = self._scalar("Q"), self._scalar("Q")
        out: dict[str, Any] = {}
        seen: set[str] = set()
        for _ in range(count):
            key = self._string()
            if key in seen:   # as GGUFReader refuses it
                raise GGUFFormatError(f"duplicate metadata key {key!r}")
            seen.add(key)
            kind = self._scalar("I")
            if key == ALIGNMENT_KEY:   # where the tensor data lies, whatever the caller wants
                if kind != _UINT32:    # as GGUFReader and llama.cpp insist
                    raise GGUFFormatError(f"{ALIGNMENT_KEY} must be a uint32 (value type {kind})")
                self.alignment = self._value(kind, 0)
                if self.alignment == 0 or self.alignment & (self.alignment - 1):
                    raise GGUFFormatError(f"{ALIGNMENT_KEY} {self.alignment} is not a power of two")
                if self.wanted(key):
                    out[key] = self.alignment
            elif self.wanted(key):
                out[key] = self._value(kind, 0)
            else:
                self._value(kind, 0, skip=True)
        return out

    def tensor_infos(self) -> list[TensorInfo]:
        """The tensor table that follows the metadata (call metadata() first)."""
        table = []
        for _ in range(self.tensor_count):
            name = self._string()
            n_dims = self._scalar("I")
            if n_dims > 8:   # GGML_MAX_DIMS is 4: a count this large is a corrupt file
                raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions")
            dims = tuple(self._scalar("Q") for _ in range(n_dims))
            table.append((name, dims, self._scalar("I"), self._scalar("Q")))
        start = -(-self.offset // self.alignment) * self.alignment
        names = [name for name, *_ in table]
        if len(set(names)) != len(names):
            raise GGUFFormatError("a tensor name appears twice")
        return [TensorInfo(name, dims, kind, start + offset) for name, dims, kind, offset in table]

    def _take(self, size: int) -> int:
        start, end = self.offset, self.offset + size
        if end > len(self.data):
            raise GGUFFormatError(f"truncated at byte {start} (the file has {len(self.data)})")
        self.offset = end
        return start

    def _scalar(self, fmt: str) -> Any:
        return struct.unpack_from(self.order + fmt, self.data, self._take(struct.calcsize(fmt)))[0]

    def _string(self, skip: bool = False) -> str | None:
        size = self._scalar("Q")
        start = self._take(size)
        if skip:
            return None
        try:
            return self.data[start:start + size].decode("utf-8")
        except UnicodeDecodeError as err:
            raise GGUFFormatError(f"a string at byte {start} is not UTF-8: {err}") from None

    def _value(self, kind: int, depth: int, skip: bool = False) -> Any:
        if kind == _STRING:
            return self._string(skip)
        fmt = _SCALARS.get(kind)
        if fmt is not None:
            return self._scalar(fmt)
        if kind != _ARRAY:
            raise GGUFFormatError(f"unknown value type {kind} before byte {self.offset}")
        if depth >= MAX_NESTING:
            raise GGUFFormatError(f"arrays nested deeper than {MAX_NESTING} at byte {self.offset}")
        item, count = self._scalar("I"), self._scalar("Q")
        fmt = _SCALARS.get(item)
        if fmt is not None:   # a numeric array in one unpack: token types are 49k of them
            start = self._take(struct.calcsize(fmt) * count)
            return None if skip else list(struct.unpack_from(f"{self.order}{count}{fmt}", self.data, start))
        values = [self._value(item, depth + 1, skip) for _ in range(count)]
        if item == _ARRAY and not skip:   # GGUFReader flattens arrays of arrays
            return [leaf for inner in values for leaf in inner]
        return values
