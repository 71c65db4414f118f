"""Builders for the system tests: real safetensors weights (about 2 MB) and an executor on the CPU."""

from __future__ import annotations

from pathlib import Path

from executor import Executor
from models import Catalog, ModelSpec, TransformerShape, write_safetensors
from prewarm import ExecutorSettings, S3Settings, Tier

SHAPE = TransformerShape(hidden=128, layers=4, vocab=1000, intermediate=344)
MB = 2**20


def models(directory: Path, count: int) -> Catalog:
    specs = []
    for i in range(count):
        path = directory / f"m{i}.safetensors"
        sha = write_safetensors(path, SHAPE, seed=i)
        specs.append(
            ModelSpec(id=f"m{i}", version="1", uri=path.as_uri(), size_bytes=path.stat().st_size, sha256=sha)
        )
    return Catalog(specs)


def executor_for(node: str, cat: Catalog, cache: Path, *, l0: int, l1: int) -> Executor:
    settings = ExecutorSettings.model_construct(
        node_name=node,
        chunk_bytes=256 * 1024,
        l2_budget_bytes=64 * MB,
        l1_budget_bytes=l1,
        l0_budget=float(l0),
        l0_reserve_bytes=0,
        read_threads=2,
        device="cpu",
    )
    return Executor(cat, executor=settings, s3=S3Settings.model_construct(), cache_dir=cache)


def tier_of(executor: Executor, model: str) -> Tier:
    state = executor.state()
    for tier in (Tier.L0, Tier.L1, Tier.L2):
        ts = state.tier(tier)
        if ts and any(r.model == model for r in ts.resident):
            return tier
    return Tier.L3
