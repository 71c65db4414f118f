"""Demo catalogs: single safetensors files, or Hugging Face checkpoints a transformers engine can start from.

``synth_checkpoint`` writes what ``LlamaForCausalLM.from_pretrained`` reads, since no hub is reachable:
``config.json`` (a Llama config), ``generation_config.json`` (greedy, so runs are comparable),
``model.safetensors.index.json`` and its shards ``model-0000k-of-0000n.safetensors``, with transformers'
tensor names and deterministic values (norm weights 1.0, the rest small normal values). Tokenizer files
are left out: the ``tokenizers`` library is not a dependency, and an engine fed token ids needs none.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from models._catalog import Catalog
from models._files import INDEX_FILE, FileSpec
from models._spec import ModelSpec
from models._synth import DTYPE_BYTES, TransformerShape, shape_for_size, write_safetensors, write_tensors
from prewarm import validate_model_id

__all__ = ["LLAMA_TINY", "synth_catalog", "synth_checkpoint"]

# Small enough to build and run in a test in well under a second; still every part of a Llama.
LLAMA_TINY = TransformerShape(hidden=64, layers=2, vocab=256, intermediate=128)
_TORCH_DTYPE = {"F16": "float16", "BF16": "bfloat16"}
# What config.json says wrote it; any 4.x reads this config.
_TRANSFORMERS_VERSION = "4.44.0"


def _llama_config(shape: TransformerShape, dtype: str) -> dict[str, Any]:
    head_dim = 64 if shape.hidden >= 512 else 16
    heads = shape.hidden // head_dim
    kv_heads = (shape.hidden // shape.kv_heads_ratio) // head_dim  # k and v are hidden / ratio wide
    if heads * head_dim != shape.hidden or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"hidden size {shape.hidden} does not split into Llama attention heads")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "initializer_range": 0.02,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": _TORCH_DTYPE[dtype],
        "transformers_version": _TRANSFORMERS_VERSION,
    }


def _split(layout: list[tuple[str, tuple[int, ...]]], shards: int, itemsize: int) -> list[list[int]]:
    """Tensor indices per shard, in order, each shard about the same number of bytes."""
    sizes = [int(np.prod(dims)) * itemsize for _, dims in layout]
    total, groups, current, filled = sum(sizes), [], [], 0
    for i, n in enumerate(sizes):
        current.append(i)
        filled += n
        left_tensors, left_shards = len(sizes) - i - 1, shards - len(groups) - 1
        if left_shards and (filled >= total * (len(groups) + 1) / shards or left_tensors == left_shards):
            groups.append(current)
            current = []
    groups.append(current)
    return groups


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def synth_checkpoint(
    directory: Path,
    *,
    model_id: str = "llama-tiny",
    version: str = "1",
    shape: TransformerShape = LLAMA_TINY,
    shards: int = 2,
    dtype: str = "BF16",
    seed: int = 0,
) -> ModelSpec:
    """Write a sharded Hugging Face Llama checkpoint into ``directory``; return its catalog entry."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}")
    layout = list(shape.tensors())
    if not 1 <= shards <= len(layout):
        raise ValueError(f"shards must be 1 to {len(layout)} for this shape")
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    config = _llama_config(shape, dtype)
    _write_json(directory / "config.json", config)
    _write_json(
        directory / "generation_config.json",
        {
            "_from_model_config": True,
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": config["eos_token_id"],
            "do_sample": False,
            "transformers_version": _TRANSFORMERS_VERSION,
        },
    )
    weight_map: dict[str, str] = {}
    for k, group in enumerate(_split(layout, shards, DTYPE_BYTES[dtype]), start=1):
        name = f"model-{k:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        tensors = [layout[i] for i in group]
        write_tensors(
            directory / name,
            tensors,
            dtype=dtype,
            seed=seed * 1000 + k,
            ones=lambda t: t.endswith("norm.weight"),
        )
        weight_map.update({tensor: name for tensor, _ in tensors})
    if shards > 1:
        total = shape.n_bytes(DTYPE_BYTES[dtype])
        _write_json(directory / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    files = [_describe(directory, path) for path in sorted(directory.rglob("*")) if _listed(directory, path)]
    weights = sum(f.size_bytes for f in files if f.path.endswith(".safetensors"))
    return ModelSpec(
        id=validate_model_id(model_id),
        version=version,
        uri=directory.as_uri() + "/",
        size_bytes=weights,
        files=tuple(files),
    )


def _listed(root: Path, path: Path) -> bool:
    # Hidden files (our temp files among them) are no part of a checkpoint.
    return path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)


def _describe(root: Path, path: Path) -> FileSpec:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * 2**20):
            digest.update(block)
    return FileSpec(
        path=path.relative_to(root).as_posix(), size_bytes=path.stat().st_size, sha256=digest.hexdigest()
    )


def synth_catalog(
    out_dir: Path,
    sizes: list[int],
    count: int | None = None,
    *,
    dtype: str = "F16",
    prefix: str = "demo",
    shards: int | None = None,
) -> Catalog:
    """Write ``count`` models (cycling through ``sizes``) under ``out_dir`` and ``out_dir/catalog.yaml``.

    Single safetensors files by default; with ``shards``, Hugging Face checkpoint directories of that
    many shards (``out_dir/<id>/``).
    """
    out_dir = Path(out_dir).resolve()
    count = len(sizes) if count is None else count
    specs = []
    for i in range(count):
        model_id = validate_model_id(f"{prefix}-{i:02d}")
        shape = shape_for_size(sizes[i % len(sizes)], DTYPE_BYTES[dtype])
        if shards is not None:
            specs.append(
                synth_checkpoint(
                    out_dir / model_id, model_id=model_id, shape=shape, shards=shards, dtype=dtype, seed=i
                )
            )
            continue
        path = out_dir / f"{model_id}.safetensors"
        sha = write_safetensors(path, shape, dtype=dtype, seed=i)
        specs.append(
            ModelSpec(id=model_id, version="1", uri=path.as_uri(), size_bytes=path.stat().st_size, sha256=sha)
        )
    catalog = Catalog(specs)
    catalog.save(out_dir / "catalog.yaml")
    return catalog
