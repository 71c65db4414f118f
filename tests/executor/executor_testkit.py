"""Helpers for executor tests: small real safetensors models (about 2 MB), settings without the env."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from executor import Executor, FileStore
from models import ModelSpec, TransformerShape, write_safetensors
from prewarm import ExecutorSettings, S3Settings

SMALL = TransformerShape(hidden=128, layers=4, vocab=1000, intermediate=344)
CHUNK = 256 * 1024  # several chunks per model, so chunk digests and overlap are exercised

ExecutorFactory = Callable[..., Executor]


def make_model(
    directory: Path, model_id: str, *, seed: int, version: str = "1", layers: int = 4
) -> ModelSpec:
    path = directory / f"{model_id}-v{version}.safetensors"
    shape = TransformerShape(SMALL.hidden, layers, SMALL.vocab, SMALL.intermediate)
    sha = write_safetensors(path, shape, seed=seed)
    return ModelSpec(
        id=model_id, version=version, uri=path.as_uri(), size_bytes=path.stat().st_size, sha256=sha
    )


def executor_settings(**overrides: Any) -> ExecutorSettings:
    values: dict[str, Any] = {
        "chunk_bytes": CHUNK,
        "l2_budget_bytes": 64 * 2**20,
        "l1_budget_bytes": 32 * 2**20,
        "l0_budget": float(32 * 2**20),
        "l0_reserve_bytes": 0,
        "read_threads": 2,
        "device": "cpu",
    }
    values.update(overrides)
    # model_construct: defaults plus these, never the environment of the machine running the tests.
    return ExecutorSettings.model_construct(**values)


def s3_settings(**overrides: Any) -> S3Settings:
    values: dict[str, Any] = {
        "s3_part_bytes": CHUNK,
        "s3_concurrency": 4,
        "s3_max_attempts": 2,
        "s3_connect_timeout_s": 2.0,
        "s3_read_timeout_s": 5.0,
    }
    values.update(overrides)
    return S3Settings.model_construct(**values)


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt one byte on disk, as bit rot would."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def serves(executor: Executor, spec: ModelSpec, weights: Path | None = None) -> bool:
    """``acquire`` yields exactly the tensors of the model's file (``weights``, else its file:// uri)."""
    expected = load_file(str(weights or FileStore.path(spec.uri)))
    with executor.acquire(spec.id) as tensors:
        return tensors.keys() == expected.keys() and all(
            torch.equal(tensors[name], tensor) for name, tensor in expected.items()
        )
