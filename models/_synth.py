"""Demo weights: real safetensors files with the tensor layout of a decoder-only transformer.

Each file has an embedding, per-layer attention (q, k, v, o) and MLP (gate, up, down) matrices and norms,
and an LM head, in fp16 or bf16, sized to land near a requested byte count. Values are drawn from a
normal distribution (one pool per model, sliced per tensor) so files look like weights to anything that
inspects them, while writing a gigabyte stays disk-bound.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["DTYPE_BYTES", "TransformerShape", "shape_for_size", "write_safetensors", "write_tensors"]

DTYPE_BYTES = {"F16": 2, "BF16": 2}
_POOL_ELEMENTS = 4 * 2**20  # 8 MiB of 16-bit values per model
_ALIGN = 8


@dataclass(frozen=True)
class TransformerShape:
    hidden: int
    layers: int
    vocab: int
    intermediate: int
    kv_heads_ratio: int = 4  # grouped-query attention: k and v are hidden / ratio wide

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        kv = self.hidden // self.kv_heads_ratio
        yield "model.embed_tokens.weight", (self.vocab, self.hidden)
        for i in range(self.layers):
            p = f"model.layers.{i}"
            yield f"{p}.input_layernorm.weight", (self.hidden,)
            yield f"{p}.self_attn.q_proj.weight", (self.hidden, self.hidden)
            yield f"{p}.self_attn.k_proj.weight", (kv, self.hidden)
            yield f"{p}.self_attn.v_proj.weight", (kv, self.hidden)
            yield f"{p}.self_attn.o_proj.weight", (self.hidden, self.hidden)
            yield f"{p}.post_attention_layernorm.weight", (self.hidden,)
            yield f"{p}.mlp.gate_proj.weight", (self.intermediate, self.hidden)
            yield f"{p}.mlp.up_proj.weight", (self.intermediate, self.hidden)
            yield f"{p}.mlp.down_proj.weight", (self.hidden, self.intermediate)
        yield "model.norm.weight", (self.hidden,)
        yield "lm_head.weight", (self.vocab, self.hidden)

    def n_bytes(self, itemsize: int = 2) -> int:
        return sum(int(np.prod(shape)) * itemsize for _, shape in self.tensors())


def shape_for_size(target_bytes: int, itemsize: int = 2) -> TransformerShape:
    """A transformer shape whose weights come close to ``target_bytes``, at a realistic depth.

    Among the usual hidden sizes, take the one whose layer count lands nearest 32 (typical of 1B-70B
    models); the layer count then absorbs the size.
    """
    candidates = []
    for hidden in (256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 8192):
        vocab = 32_000 if hidden >= 1024 else 8_000
        intermediate = (hidden * 8 // 3 + 255) // 256 * 256
        base = TransformerShape(hidden, 0, vocab, intermediate).n_bytes(itemsize)
        per_layer = TransformerShape(hidden, 1, vocab, intermediate).n_bytes(itemsize) - base
        layers = max(1, round((target_bytes - base) / per_layer))
        candidates.append(TransformerShape(hidden, layers, vocab, intermediate))
    return min(
        candidates,
        key=lambda s: (abs(math.log(s.layers / 32)), abs(s.n_bytes(itemsize) - target_bytes)),
    )


def _pool(seed: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(_POOL_ELEMENTS, dtype=np.float32) * 0.02).astype(np.float32)
    if dtype == "F16":
        return values.astype(np.float16).view(np.uint16)
    # bf16 is the top half of an fp32.
    return (values.view(np.uint32) >> 16).astype(np.uint16)


def write_safetensors(path: Path, shape: TransformerShape, *, dtype: str = "F16", seed: int = 0) -> str:
    """Write ``path`` (temp file, fsync, rename) and return its sha256."""
    return write_tensors(path, list(shape.tensors()), dtype=dtype, seed=seed)


def write_tensors(
    path: Path,
    layout: Sequence[tuple[str, tuple[int, ...]]],
    *,
    dtype: str = "F16",
    seed: int = 0,
    ones: Callable[[str], bool] = lambda _name: False,
) -> str:
    """Write the named tensors of ``layout`` to ``path`` (temp file, fsync, rename); return its sha256.

    Values come from the model's pool; tensors for which ``ones(name)`` holds are all 1.0 instead
    (norm weights, so that a synthesized model computes like a real one rather than towards zero).
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}")
    itemsize = DTYPE_BYTES[dtype]
    header: dict[str, object] = {"__metadata__": {"format": "pt", "generator": "prewarm models synth"}}
    offset = 0
    for name, dims in layout:
        n = int(np.prod(dims)) * itemsize
        header[name] = {"dtype": dtype, "shape": list(dims), "data_offsets": [offset, offset + n]}
        offset += n
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % _ALIGN)
    pool = _pool(seed, dtype)
    one = np.array([1.0], dtype=np.float32)
    one_bits = one.astype(np.float16).view(np.uint16) if dtype == "F16" else one.view(np.uint32) >> 16
    digest = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        for chunk in (struct.pack("<Q", len(header_bytes)), header_bytes):
            f.write(chunk)
            digest.update(chunk)
        cursor = 0
        for name, dims in layout:
            remaining = int(np.prod(dims))
            if ones(name):
                block = np.full(remaining, one_bits[0], dtype=np.uint16).tobytes()
                f.write(block)
                digest.update(block)
                continue
            while remaining:
                take = min(remaining, _POOL_ELEMENTS - cursor)
                block = pool[cursor : cursor + take].tobytes()
                f.write(block)
                digest.update(block)
                remaining -= take
                cursor = (cursor + take + 7919) % _POOL_ELEMENTS  # prime stride: tensors differ
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return digest.hexdigest()
