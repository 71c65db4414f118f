"""Hugging Face checkpoints through the tiers: L3 → L2 as one verified directory, and up from there."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import torch
from executor_testkit import SMALL, ExecutorFactory, flip_byte, make_model
from safetensors.torch import load_file

from executor import Executor
from executor._l2 import L2Object
from executor._tier import round_up
from models import INDEX_FILE, Catalog, FileSpec, ModelSpec, TransformerShape, synth_checkpoint
from prewarm import IntegrityError, InvalidWeights, Tier

SHARDS = 3


@pytest.fixture
def l3(tmp_path: Path) -> Path:
    return tmp_path / "l3"


@pytest.fixture
def checkpoint(l3: Path) -> ModelSpec:
    # About 2 MB in three shards: several 256 KiB chunks per shard.
    return synth_checkpoint(l3 / "org" / "llama", model_id="org/llama", shape=SMALL, shards=SHARDS)


def _tensors(spec: ModelSpec, root: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in spec.weight_files() for k, v in load_file(str(root / f.path)).items()}


def _l2(executor: Executor, spec: ModelSpec) -> L2Object:
    assert spec.sha256 is not None
    obj = executor.l2.lookup(spec.sha256)
    assert obj is not None
    return obj


def _serves_checkpoint(executor: Executor, spec: ModelSpec, root: Path) -> bool:
    expected = _tensors(spec, root)
    with executor.acquire(spec.id) as tensors:
        return tensors.keys() == expected.keys() and all(
            torch.equal(tensors[k], v) for k, v in expected.items()
        )


def _nothing_cached(executor: Executor) -> bool:
    root = executor.l2.root
    leftovers = [p for p in (root / "tmp").iterdir()] + [p for p in root.glob("models/**/*") if p.is_file()]
    return leftovers == [] and all(t.used_bytes == 0 for t in executor.state().tiers)


def _describe(root: Path, model_id: str) -> ModelSpec:
    """A catalog entry for a directory as it is now (what ``register`` would write, without its checks)."""
    files = [
        FileSpec(path=p.name, size_bytes=p.stat().st_size, sha256=hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.iterdir())
    ]
    weights = sum(f.size_bytes for f in files if f.path.endswith(".safetensors"))
    return ModelSpec(
        id=model_id, version="1", uri=root.as_uri() + "/", size_bytes=weights, files=tuple(files)
    )


def test_checkpoint_moves_l3_to_l2_as_one_verified_directory(
    checkpoint: ModelSpec, l3: Path, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(Catalog([checkpoint]))

    result = executor.ensure("org/llama", Tier.L2)

    assert result.served_from is Tier.L3
    obj = _l2(executor, checkpoint)
    root = l3 / "org" / "llama"
    # One directory an engine can be pointed at, holding every file under its own name, byte for byte.
    assert obj.directory.parent == executor.l2.root / "models" / "org" / "llama"
    assert obj.directory.name.startswith("1@")
    assert sorted(p.name for p in obj.directory.iterdir()) == sorted(f.path for f in checkpoint.files)
    assert [(rel, size) for rel, _, size in obj.files()] == [(f.path, f.size_bytes) for f in checkpoint.files]
    for rel, path, _ in obj.files():
        assert path == obj.directory / rel
        assert path.read_bytes() == (root / rel).read_bytes()
    # Capacity counts every file, the small ones too.
    assert executor.state().tiers[2].used_bytes == sum(f.size_bytes for f in checkpoint.files)
    assert list((executor.l2.root / "tmp").iterdir()) == []
    assert executor.ensure("org/llama", Tier.L2).served_from is Tier.L2
    assert all(r.ok for r in executor.verify())


@pytest.mark.parametrize("structure", ["cpu-direct", "cuda", "staging-ring"])
def test_checkpoint_reaches_l0_with_the_tensors_of_every_shard(
    checkpoint: ModelSpec, l3: Path, make_executor: ExecutorFactory, structure: str
) -> None:
    # "cuda": through an L1 block with device copies; "staging-ring": L1 too small for the model.
    overrides = {"l1_budget_bytes": 2**20} if structure == "staging-ring" else {}
    executor = make_executor(Catalog([checkpoint]), direct_l0=structure == "cpu-direct", **overrides)

    result = executor.ensure("org/llama", Tier.L0)

    assert result.served_from is Tier.L3
    assert _serves_checkpoint(executor, checkpoint, l3 / "org" / "llama")
    used = {t.tier: t.used_bytes for t in executor.state().tiers}
    # The weights only, each shard at an aligned offset: a few KiB over their sum at most.
    assert checkpoint.size_bytes <= used[Tier.L0] < checkpoint.size_bytes + SHARDS * 4096
    if structure == "cuda":
        assert used[Tier.L1] == round_up(used[Tier.L0])  # L1 blocks are whole pages


def test_checkpoint_goes_up_the_tiers_one_at_a_time(
    checkpoint: ModelSpec, l3: Path, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(Catalog([checkpoint]), direct_l0=False)
    served = [executor.ensure("org/llama", tier).served_from for tier in (Tier.L2, Tier.L1, Tier.L0)]
    assert served == [Tier.L3, Tier.L2, Tier.L1]
    assert _serves_checkpoint(executor, checkpoint, l3 / "org" / "llama")


def test_corrupted_shard_in_l3_is_refused_and_nothing_is_cached(
    checkpoint: ModelSpec, l3: Path, make_executor: ExecutorFactory
) -> None:
    shard = checkpoint.weight_files()[1]
    flip_byte(l3 / "org" / "llama" / shard.path, shard.size_bytes // 2)
    executor = make_executor(Catalog([checkpoint]))

    with pytest.raises(IntegrityError, match=re.escape(shard.path)):
        executor.ensure("org/llama", Tier.L2)

    assert _nothing_cached(executor)


def test_truncated_file_in_l2_is_detected_and_fetched_again(
    checkpoint: ModelSpec, l3: Path, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(Catalog([checkpoint]))
    executor.ensure("org/llama", Tier.L2)
    shard = _l2(executor, checkpoint).directory / checkpoint.weight_files()[0].path
    os.truncate(shard, shard.stat().st_size // 2)

    # A use of the directory checks every file's size: an engine may be pointed at it as it is.
    assert executor.ensure("org/llama", Tier.L2).served_from is Tier.L3
    assert shard.read_bytes() == (l3 / "org" / "llama" / shard.name).read_bytes()

    # After a restart, the index's sizes are checked before anything is adopted.
    os.truncate(shard, 10)
    executor.close()
    again = make_executor(Catalog([checkpoint]), cache_dir=executor.l2.root)
    assert again.ensure("org/llama", Tier.L0).served_from is Tier.L3
    assert _serves_checkpoint(again, checkpoint, l3 / "org" / "llama")


def test_flipped_byte_in_an_l2_shard_is_caught_on_the_way_up_and_fetched_again(
    checkpoint: ModelSpec, l3: Path, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(Catalog([checkpoint]))
    executor.ensure("org/llama", Tier.L2)
    last = checkpoint.weight_files()[-1]
    flip_byte(_l2(executor, checkpoint).directory / last.path, last.size_bytes - 100)

    assert executor.ensure("org/llama", Tier.L0).served_from is Tier.L3  # its chunk digest failed
    assert _serves_checkpoint(executor, checkpoint, l3 / "org" / "llama")
    assert all(r.ok for r in executor.verify())


def test_verify_names_the_corrupt_file_of_a_checkpoint_and_evicts_the_directory(
    checkpoint: ModelSpec, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(Catalog([checkpoint]))
    executor.ensure("org/llama", Tier.L2)
    directory = _l2(executor, checkpoint).directory
    flip_byte(directory / "config.json", 3)

    (result,) = executor.verify()

    assert not result.ok
    assert "config.json" in result.detail
    assert not directory.exists()
    assert executor.ensure("org/llama", Tier.L2).served_from is Tier.L3


def test_an_index_that_misplaces_a_tensor_is_refused_on_entry(
    l3: Path, make_executor: ExecutorFactory
) -> None:
    root = l3 / "misplaced"
    synth_checkpoint(root, model_id="misplaced", shape=SMALL, shards=2)
    index = json.loads((root / INDEX_FILE).read_text())
    index["weight_map"]["model.embed_tokens.weight"] = "model-00002-of-00002.safetensors"
    (root / INDEX_FILE).write_text(json.dumps(index))
    spec = _describe(root, "misplaced")  # digests of the files as they are: only the index is wrong
    executor = make_executor(Catalog([spec]))

    with pytest.raises(InvalidWeights, match=re.escape("model.embed_tokens.weight")):
        executor.ensure("misplaced", Tier.L2)

    assert _nothing_cached(executor)


def test_checkpoint_directory_survives_a_restart_and_eviction_removes_it(
    l3: Path, make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    shape = TransformerShape(SMALL.hidden, 2, SMALL.vocab, SMALL.intermediate)
    specs = [synth_checkpoint(l3 / f"c{i}", model_id=f"team/c{i}", shape=shape, seed=i) for i in range(3)]
    catalog = Catalog(specs)
    one = sum(f.size_bytes for f in specs[0].files)
    cache = tmp_path / "shared"
    first = make_executor(catalog, cache_dir=cache, l2_budget_bytes=2 * one + 1000)
    first.ensure("team/c0", Tier.L2)
    first.close()

    second = make_executor(catalog, cache_dir=cache, l2_budget_bytes=2 * one + 1000)
    assert second.ensure("team/c0", Tier.L2).served_from is Tier.L2  # adopted from the index
    gone = _l2(second, specs[0]).directory
    second.ensure("team/c1", Tier.L2)
    second.ensure("team/c2", Tier.L2)  # no room for three: the least recently used goes

    assert not gone.exists()
    assert not gone.parent.exists()  # team/c0 had no other version: its directory went too
    assert {r.model for r in second.state().tiers[2].resident} == {"team/c1", "team/c2"}
    assert second.state().tiers[2].used_bytes <= 2 * one + 1000


def test_leftovers_of_a_crashed_checkpoint_download_are_cleaned_at_start(
    checkpoint: ModelSpec, make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    make_executor(Catalog([checkpoint]), cache_dir=cache).close()
    partial = cache / "tmp" / f"{'cd' * 32}.{os.getpid()}.dir"
    (partial / "sub").mkdir(parents=True)
    (partial / "sub" / "config.json").write_text("{")
    orphan = cache / "models" / "org" / "other" / "1@0123456789abcdef"  # renamed but never indexed
    orphan.mkdir(parents=True)
    (orphan / "config.json").write_text("{}")

    executor = make_executor(Catalog([checkpoint]), cache_dir=cache)

    assert not partial.exists()
    assert not (cache / "models" / "org" / "other").exists()
    assert executor.ensure("org/llama", Tier.L2).served_from is Tier.L3


def test_a_single_file_entry_is_one_file_in_l2_as_before(
    weights_dir: Path, make_executor: ExecutorFactory
) -> None:
    spec = make_model(weights_dir, "single", seed=3)
    executor = make_executor(Catalog([spec]))
    executor.ensure("single", Tier.L2)
    obj = _l2(executor, spec)

    assert not obj.is_checkpoint
    assert obj.path == executor.l2.object_path(spec.sha256 or "")
    assert obj.files() == [("single-v1.safetensors", obj.path, spec.size_bytes)]
    assert obj.directory == obj.path.parent


def test_an_index_of_version_1_is_still_read(
    weights_dir: Path, make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    spec = make_model(weights_dir, "old", seed=4)
    cache = tmp_path / "c"
    make_executor(Catalog([spec]), cache_dir=cache).ensure("old", Tier.L2)
    index = json.loads((cache / "index.json").read_text())
    for raw in index["objects"].values():
        raw.pop("name", None)  # what an index written before checkpoints holds
    (cache / "index.json").write_text(json.dumps({**index, "version": 1}))

    executor = make_executor(Catalog([spec]), cache_dir=cache)

    assert executor.ensure("old", Tier.L1).served_from is Tier.L2
