"""Tensors from safetensors bytes already in memory: the header parsed here, the data left in place.

The executor validated every file when it entered its cache; the client still checks what it relies on
(the header's bounds, each tensor inside its file and of the size its shape says), because a wrong
offset here would read another file's bytes or past the mapping, and it costs microseconds.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from prewarm_client._protocol import ProtocolError

__all__ = ["DTYPES", "tensors_in"]

_MAX_HEADER = 100 * 2**20  # the safetensors library's own limit

DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def tensors_in(
    buffer: Any, offset: int, length: int, *, name: str, within: tuple[int, int] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for each tensor of the safetensors file at ``buffer[offset:offset+length]``,
    in file order, each a view of ``buffer`` (no copy) unless its offset is not element-aligned.
    ``within``: only the tensors that start in that byte range of ``buffer`` (one rank's shard)."""
    view = memoryview(buffer)[offset : offset + length]
    if length < 8:
        raise ProtocolError(f"{name}: shorter than a safetensors prefix")
    (n,) = struct.unpack("<Q", view[:8])
    if n > min(_MAX_HEADER, length - 8):
        raise ProtocolError(f"{name}: header length {n} runs past the file")
    try:
        header = json.loads(bytes(view[8 : 8 + n]))
    except ValueError as exc:
        raise ProtocolError(f"{name}: header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ProtocolError(f"{name}: header is not an object")
    header.pop("__metadata__", None)
    data_start = 8 + n
    entries = []
    for tensor_name, info in header.items():
        try:
            dtype = DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"{name}: bad entry {tensor_name!r}: {exc}") from exc
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= length - data_start or end - begin != math.prod(shape) * itemsize:
            raise ProtocolError(f"{name}: {tensor_name!r} does not fit its file")
        entries.append((begin, end, tensor_name, dtype, shape))
    entries.sort()
    with warnings.catch_warnings():
        # The mapping is read-only on purpose (the block is shared); torch warns that it cannot mark a
        # tensor read-only. A write to one faults instead of changing the executor's copy.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        for begin, end, tensor_name, dtype, shape in entries:
            start = offset + data_start + begin
            if within is not None and not within[0] <= start < within[1]:
                continue
            count = math.prod(shape)
            if count == 0:
                yield tensor_name, torch.empty(shape, dtype=dtype)
                continue
            itemsize = (end - begin) // count
            if start % itemsize:
                # A reinterpreting view needs an element-aligned address; copy this one tensor.
                raw = torch.frombuffer(buffer, dtype=torch.uint8, count=end - begin, offset=start).clone()
                yield tensor_name, raw.view(dtype).view(shape)
            else:
                yield (
                    tensor_name,
                    torch.frombuffer(buffer, dtype=dtype, count=count, offset=start).view(shape),
                )
