"""Safetensors headers, validated before a single byte of weights is allocated, and tensor views.

A file is ``u64 little-endian header length | JSON header | data``. The header is untrusted input from
object storage: a crafted length or offset must never make us allocate gigabytes or read outside the
file, so every rule is checked here, once, and the rest of the executor works from a ``Layout``.
A loaded model is one flat ``uint8`` buffer holding the whole file; ``tensor_views`` carves the named
tensors out of it without copying.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from prewarm import InvalidWeights

__all__ = ["DTYPES", "MAX_HEADER_BYTES", "Layout", "TensorEntry", "parse_header", "tensor_views"]

# The limit the safetensors library itself enforces; a real header is kilobytes to a few megabytes.
MAX_HEADER_BYTES = 100 * 2**20

DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "BOOL": (torch.bool, 1),
    "U8": (torch.uint8, 1),
    "I8": (torch.int8, 1),
    "I16": (torch.int16, 2),
    "U16": (torch.uint16, 2),
    "I32": (torch.int32, 4),
    "U32": (torch.uint32, 4),
    "I64": (torch.int64, 8),
    "U64": (torch.uint64, 8),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "F32": (torch.float32, 4),
    "F64": (torch.float64, 8),
    "F8_E4M3": (torch.float8_e4m3fn, 1),
    "F8_E5M2": (torch.float8_e5m2, 1),
}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offsets in the file, header included
    end: int


@dataclass(frozen=True)
class Layout:
    header_bytes: int  # the JSON header's length (without the 8-byte prefix)
    file_bytes: int
    tensors: tuple[TensorEntry, ...]
    metadata: Mapping[str, str]

    @property
    def data_start(self) -> int:
        return 8 + self.header_bytes


def header_length(prefix: bytes, file_bytes: int) -> int:
    """The header length from the first 8 bytes, bounded before anyone reads or allocates that much."""
    if len(prefix) < 8 or file_bytes < 8:
        raise InvalidWeights("file is shorter than the 8-byte safetensors prefix", reason="truncated")
    n: int = struct.unpack("<Q", prefix[:8])[0]
    if n > MAX_HEADER_BYTES:
        raise InvalidWeights(f"header length {n} exceeds {MAX_HEADER_BYTES}", reason="header_too_large")
    if n > file_bytes - 8:
        raise InvalidWeights(f"header length {n} runs past the end of the file", reason="header_too_large")
    if n < 2:
        raise InvalidWeights("header is empty", reason="bad_header")
    return n


def parse_header(header: bytes, file_bytes: int) -> Layout:
    """Validate a JSON header against the file size; ``InvalidWeights`` names the first broken rule."""
    try:
        data = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidWeights(f"header is not JSON: {exc}", reason="bad_header") from exc
    if not isinstance(data, dict):
        raise InvalidWeights("header must be a JSON object", reason="bad_header")
    metadata = data.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise InvalidWeights("__metadata__ must map strings to strings", reason="bad_header")
    data_start = 8 + len(header)
    data_bytes = file_bytes - data_start
    entries: list[TensorEntry] = []
    for name, info in data.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise InvalidWeights(
                f"{name}: entry needs exactly dtype, shape, data_offsets", reason="bad_header"
            )
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise InvalidWeights(f"{name}: unknown dtype {dtype!r}", reason="unknown_dtype")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise InvalidWeights(f"{name}: shape must be a list of non-negative ints", reason="bad_header")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int and o >= 0 for o in offsets)
        ):
            raise InvalidWeights(f"{name}: data_offsets must be two non-negative ints", reason="bad_offsets")
        begin, end = offsets
        if begin > end or end > data_bytes:
            raise InvalidWeights(
                f"{name}: data_offsets [{begin}, {end}] outside the {data_bytes} data bytes",
                reason="bad_offsets",
            )
        if end - begin != math.prod(shape) * DTYPES[dtype][1]:
            raise InvalidWeights(
                f"{name}: {end - begin} bytes do not match shape and dtype", reason="bad_offsets"
            )
        entries.append(TensorEntry(name, dtype, tuple(shape), data_start + begin, data_start + end))
    entries.sort(key=lambda e: (e.start, e.end))
    cursor = data_start
    for entry in entries:
        # Contiguous and non-overlapping: a gap hides bytes nobody checks, an overlap aliases tensors.
        if entry.start != cursor:
            what = "overlaps the previous tensor" if entry.start < cursor else "leaves a gap before it"
            raise InvalidWeights(f"{entry.name}: {what}", reason="bad_offsets")
        cursor = entry.end
    if cursor != file_bytes:
        raise InvalidWeights(
            f"tensors end at byte {cursor} but the file has {file_bytes}", reason="size_mismatch"
        )
    return Layout(len(header), file_bytes, tuple(entries), dict(metadata))


def tensor_views(buffer: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """name → tensor viewing ``buffer`` (flat uint8, the whole file) with the right dtype and shape."""
    if buffer.dtype is not torch.uint8 or buffer.dim() != 1 or buffer.numel() < layout.file_bytes:
        raise ValueError("buffer must be a flat uint8 tensor holding the whole file")
    views: dict[str, torch.Tensor] = {}
    for entry in layout.tensors:
        dtype, itemsize = DTYPES[entry.dtype]
        raw = buffer[entry.start : entry.end]
        if entry.start % itemsize:
            # A reinterpreting view needs an element-aligned offset; safetensors does not promise one.
            # Copying this one tensor is the price of accepting every valid file.
            raw = raw.clone()
        views[entry.name] = raw.view(dtype).view(entry.shape)
    return views
