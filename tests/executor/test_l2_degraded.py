"""A full or failing L2 disk degrades, it does not stop serving: loads stream L3 → L1/L0 past L2.

Two kinds of test: on a real small filesystem (a tmpfs mounted for the test, which needs root or
CAP_SYS_ADMIN: skipped with the reason where it cannot be mounted), with real S3 as L3; and with the
fault injected at the L2 write boundary (the ``os`` calls on the cache's own descriptors), which always
runs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from executor_testkit import SMALL, ExecutorFactory, make_model, s3_settings, serves
from metrics_helpers import metric_delta, sample
from safetensors.torch import load_file, save_file

from executor import Executor, FileStore, S3Store
from executor._stores import OnPiece
from models import Catalog, ModelSpec, synth_checkpoint
from prewarm import CapacityError, IntegrityError, StorageError, Tier

MB = 2**20
BYPASS = "prewarm_executor_l2_bypass_total"
# The structures a load to memory can take on this machine: to L1; to L0 on the CPU device, straight
# into the L0 buffer; to L0 the way CUDA does it (through an L1 block, with device copies per part).
TARGETS = [
    pytest.param(Tier.L1, True, id="to-L1"),
    pytest.param(Tier.L0, True, id="to-L0-cpu-direct"),
    pytest.param(Tier.L0, False, id="to-L0-cuda-structure"),
]


# ---------------------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def mounted_tmpfs(where: Path, size_mb: int, *, read_only: bool = False) -> Iterator[Path]:
    """A real filesystem of ``size_mb`` MB at ``where``; the test is skipped where none can be mounted."""
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size_mb}m" + (",ro" if read_only else "")
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a {size_mb} MB tmpfs (needs root or CAP_SYS_ADMIN): {exc}")
    try:
        yield where
    finally:
        # Lazy: an executor the factory closes after this test may still hold a descriptor there.
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True, timeout=30)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """The issue's case: L2 on a 100 MB filesystem."""
    with mounted_tmpfs(tmp_path / "small-disk", 100) as where:
        yield where


def nothing_in_l2(executor: Executor) -> bool:
    """No object, checkpoint directory or download leftover, and nothing accounted."""
    root = executor.l2.root
    files = [p for sub in ("objects", "models", "tmp") for p in (root / sub).rglob("*") if p.is_file()]
    return files == [] and executor.l2.cache.used == 0


def l2_capacity(executor: Executor) -> int:
    return next(t.capacity_bytes for t in executor.state().tiers if t.tier is Tier.L2)


def resident(executor: Executor, tier: Tier) -> list[str]:
    return [r.model for t in executor.state().tiers if t.tier is tier for r in t.resident]


@contextlib.contextmanager
def failing(
    monkeypatch: pytest.MonkeyPatch, call: str, under: Path, code: int, times: int = -1
) -> Iterator[list[int]]:
    """``os.<call>`` fails with ``code`` on descriptors of files under ``under`` (``times`` times; -1:
    always); every other descriptor works as ever. Yields the list of failures made so far."""
    real: Callable[..., Any] = getattr(os, call)
    failures: list[int] = []

    def fake(fd: int, *args: Any) -> Any:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(str(under)) and (times < 0 or len(failures) < times):
            failures.append(fd)
            raise OSError(code, os.strerror(code))
        return real(fd, *args)

    monkeypatch.setattr(os, call, fake)
    yield failures
    monkeypatch.setattr(os, call, real)


def take_all_free_space(path: Path, leave: int = 0) -> None:
    """Another writer fills the filesystem of ``path`` (all of it but ``leave`` bytes)."""
    with open(path, "wb") as f:
        n = shutil.disk_usage(path.parent).free - leave
        while n > 0:
            try:
                os.posix_fallocate(f.fileno(), 0, n)
                return
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                n -= 64 * 1024  # the filesystem's own rounding: a little less


def big_model(directory: Path, model_id: str = "big", mib: int = 256) -> ModelSpec:
    """A ``mib`` MiB safetensors file in 16 MiB tensors."""
    path = directory / f"{model_id}.safetensors"
    generator = torch.Generator().manual_seed(13)
    tensors = {
        f"layers.{i}.weight": torch.randn(8 * MB, generator=generator, dtype=torch.float16)
        for i in range(mib // 16)
    }
    save_file(tensors, str(path))
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(16 * MB):
            digest.update(block)
    return ModelSpec(
        id=model_id, version="1", uri=path.as_uri(), size_bytes=path.stat().st_size, sha256=digest.hexdigest()
    )


def upload(spec: ModelSpec, s3_endpoint: str, bucket: str, key: str) -> ModelSpec:
    store = S3Store(s3_settings(s3_endpoint=s3_endpoint))
    store.ensure_bucket(bucket)
    uri = f"s3://{bucket}/executor-tests/{key}"
    store.put_file(FileStore.path(spec.uri), uri)
    return spec.model_copy(update={"uri": uri})


class CorruptOnce(FileStore):
    """L3 that hands out one flipped byte on its first ranged read of a weights file, then good bytes."""

    def __init__(self) -> None:
        self.corrupted = False

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        super().read_range_into(uri, start, dest, on_piece)
        if not self.corrupted and uri.endswith(".safetensors") and start > 0:
            self.corrupted = True
            dest[len(dest) // 2] ^= 0xFF


def checkpoint_tensors(spec: ModelSpec, root: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in spec.weight_files() for k, v in load_file(str(root / f.path)).items()}


def serves_checkpoint(executor: Executor, spec: ModelSpec, root: Path) -> bool:
    expected = checkpoint_tensors(spec, root)
    with executor.acquire(spec.id) as tensors:
        return tensors.keys() == expected.keys() and all(
            torch.equal(tensors[k], v) for k, v in expected.items()
        )


# ------------------------------------------------------------------ a real small disk, real S3


@pytest.fixture(scope="module")
def big_on_s3(
    s3_endpoint: str, s3_bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ModelSpec, Path]:
    """The issue's 256 MB model on the stack's S3, and its file (to compare tensors with)."""
    directory = tmp_path_factory.mktemp("big")
    spec = big_model(directory)
    key = f"{os.getpid()}-{spec.sha256 and spec.sha256[:12]}/big.safetensors"
    return upload(spec, s3_endpoint, s3_bucket, key), FileStore.path(spec.uri)


@pytest.mark.parametrize(("tier", "direct_l0"), TARGETS)
def test_a_model_bigger_than_the_l2_disk_reaches_memory_from_s3_without_caching(
    big_on_s3: tuple[ModelSpec, Path],
    small_disk: Path,
    s3_endpoint: str,
    make_executor: ExecutorFactory,
    tier: Tier,
    direct_l0: bool,
) -> None:
    spec, weights = big_on_s3
    room = spec.size_bytes + 16 * MB
    executor = make_executor(
        Catalog([spec]),
        cache_dir=small_disk / "cache",
        s3=s3_settings(s3_endpoint=s3_endpoint, s3_part_bytes=8 * MB),
        direct_l0=direct_l0,
        l2_budget_bytes=50 * 10**9,  # configured far beyond the disk: the cap brings it down to it
        l1_budget_bytes=room,
        l0_budget=float(room),
    )
    assert l2_capacity(executor) <= 100 * MB < spec.size_bytes

    with metric_delta(BYPASS, {"reason": "full"}) as full:
        result = executor.ensure("big", tier)

    assert result.served_from is Tier.L3
    assert result.tier is tier
    assert full.delta == 1
    assert resident(executor, tier) == [spec.id]  # the model is at the tier the order asked for
    assert nothing_in_l2(executor)
    assert serves(executor, spec, weights)  # the exact tensors (and to L0 from L1 where it was L1)


def test_a_disk_that_fills_up_mid_download_still_brings_the_model_to_memory(
    s3_endpoint: str,
    s3_bucket: str,
    small_disk: Path,
    weights_dir: Path,
    unique: str,
    make_executor: ExecutorFactory,
) -> None:
    spec = upload(
        make_model(weights_dir, "s3m", seed=11, layers=8), s3_endpoint, s3_bucket, f"{unique}/s3m.safetensors"
    )
    filler = small_disk / "someone-else"

    class FillsTheDisk(S3Store):
        """Another writer takes every free byte of the L2 filesystem once the download has begun."""

        filled = False

        def read_range_into(
            self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
        ) -> None:
            if not self.filled:
                self.filled = True
                take_all_free_space(filler)
            super().read_range_into(uri, start, dest, on_piece)

    s3 = s3_settings(s3_endpoint=s3_endpoint, s3_part_bytes=256 * 1024)
    executor = make_executor(
        Catalog([spec]), cache_dir=small_disk / "cache", s3=s3, stores={"s3": FillsTheDisk(s3)}
    )

    with metric_delta(BYPASS, {"reason": "no_space"}) as no_space:
        result = executor.ensure("s3m", Tier.L1)

    assert result.served_from is Tier.L3
    assert no_space.delta == 1  # a real ENOSPC from the filesystem, mid-download
    assert nothing_in_l2(executor)
    assert serves(executor, spec, weights_dir / "s3m-v1.safetensors")
    # Once the disk has room again the next load caches as ever.
    filler.unlink()
    executor.evict("s3m", Tier.L3)
    assert executor.ensure("s3m", Tier.L2).served_from is Tier.L3
    assert executor.verify()[0].ok


def test_the_l2_budget_is_capped_at_what_a_real_filesystem_holds(
    small_disk: Path, catalog: Catalog, make_executor: ExecutorFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="executor")
    executor = make_executor(catalog, cache_dir=small_disk / "cache", l2_budget_bytes=50 * 10**9)

    assert 90 * MB <= l2_capacity(executor) <= 100 * MB
    assert sample("prewarm_executor_l2_budget_bytes", {"budget": "configured"}) == 50 * 10**9
    assert sample("prewarm_executor_l2_budget_bytes", {"budget": "effective"}) == l2_capacity(executor)
    assert [r for r in caplog.records if "budget capped" in r.getMessage()]

    # What the cache holds itself still counts as room; what others take does not.
    executor.ensure("m0", Tier.L2)
    with open(small_disk / "someone-else", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 40 * MB)
    capacity = l2_capacity(executor)
    assert capacity <= 60 * MB
    assert capacity >= executor.l2.cache.used


def test_a_read_only_l2_disk_leaves_l2_empty_and_loads_still_serve(
    tmp_path: Path, catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    with mounted_tmpfs(tmp_path / "ro", 10, read_only=True) as ro:
        executor = make_executor(catalog, cache_dir=ro / "cache")

        assert l2_capacity(executor) == 0
        with metric_delta(BYPASS, {"reason": "read_only"}) as read_only:
            assert executor.ensure("m0", Tier.L0).served_from is Tier.L3
        assert read_only.delta == 1
        assert serves(executor, catalog["m0"])
        with pytest.raises(StorageError, match="unusable"):
            executor.ensure("m1", Tier.L2)  # L2 itself is what this order asks for: it fails, saying why


# ----------------------------------------------------------- faults injected at the L2 boundary


@pytest.mark.parametrize(("tier", "direct_l0"), TARGETS)
def test_enospc_on_an_l2_write_streams_the_load_past_l2(
    catalog: Catalog,
    make_executor: ExecutorFactory,
    monkeypatch: pytest.MonkeyPatch,
    tier: Tier,
    direct_l0: bool,
) -> None:
    executor = make_executor(catalog, direct_l0=direct_l0)
    with failing(monkeypatch, "pwrite", executor.l2.root / "tmp", errno.ENOSPC) as failures:
        with metric_delta(BYPASS, {"reason": "no_space"}) as no_space:
            result = executor.ensure("m0", tier)
        assert failures  # the fault was hit, mid-download

    assert result.served_from is Tier.L3
    assert no_space.delta == 1
    assert resident(executor, tier) == ["m0"]
    assert nothing_in_l2(executor)
    assert serves(executor, catalog["m0"])


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.ENOSPC, "no_space"),
        (errno.EDQUOT, "quota"),
        (errno.EIO, "io_error"),
        (errno.EROFS, "read_only"),
    ],
)
def test_each_disk_fault_is_counted_under_its_reason(
    catalog: Catalog, make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    executor = make_executor(catalog)
    tmp = executor.l2.root / "tmp"
    with failing(monkeypatch, "pwrite", tmp, code), metric_delta(BYPASS, {"reason": reason}) as counted:
        assert executor.ensure("m1", Tier.L1).served_from is Tier.L3
    assert counted.delta == 1
    assert nothing_in_l2(executor)


def test_a_failing_fsync_when_publishing_streams_past_l2_too(
    catalog: Catalog, make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = make_executor(catalog)
    with failing(monkeypatch, "fsync", executor.l2.root / "tmp", errno.EIO) as failures:
        with metric_delta(BYPASS, {"reason": "io_error"}) as io_error:
            assert executor.ensure("m2", Tier.L0).served_from is Tier.L3
        assert failures
    assert io_error.delta == 1
    assert nothing_in_l2(executor)
    assert serves(executor, catalog["m2"])


def test_a_load_to_l2_itself_still_fails_with_the_disk_error(
    catalog: Catalog, make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = make_executor(catalog)
    tmp = executor.l2.root / "tmp"
    with (
        failing(monkeypatch, "pwrite", tmp, errno.ENOSPC),
        pytest.raises(StorageError, match="No space left"),
    ):
        executor.ensure("m0", Tier.L2)
    assert nothing_in_l2(executor)
    assert all(t.used_bytes == 0 for t in executor.state().tiers)


def test_a_model_neither_l2_nor_l1_can_take_fails_to_reach_cuda_l0_saying_why(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    size = catalog["m0"].size_bytes
    # The CUDA structure: a model L1 cannot hold goes to L0 through the staging ring, which reads L2.
    executor = make_executor(catalog, direct_l0=False, l1_budget_bytes=size // 2, l2_budget_bytes=size // 2)
    with pytest.raises(CapacityError, match=r"L2 cannot take it .* and L1 cannot hold it"):
        executor.ensure("m0", Tier.L0)
    assert all(t.used_bytes == 0 for t in executor.state().tiers)


def test_an_l2_copy_the_disk_cannot_read_back_is_fetched_again(
    catalog: Catalog, make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = make_executor(catalog, l2_direct_io=False)  # buffered reads: os.preadv on every chunk
    executor.ensure("m0", Tier.L2)
    with failing(monkeypatch, "preadv", executor.l2.root / "objects", errno.EIO, times=1) as failures:
        result = executor.ensure("m0", Tier.L1)
    assert failures
    assert result.served_from is Tier.L3
    assert serves(executor, catalog["m0"])
    assert executor.verify()[0].ok  # cached again on the way


def test_a_budget_too_small_for_the_model_streams_it_and_counts_full(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    size = catalog["m0"].size_bytes
    executor = make_executor(catalog, l2_budget_bytes=size // 2)
    with metric_delta(BYPASS, {"reason": "full"}) as full:
        assert executor.ensure("m0", Tier.L1).served_from is Tier.L3
        assert executor.ensure("m1", Tier.L0).served_from is Tier.L3
    assert full.delta == 2  # counted per load
    assert nothing_in_l2(executor)
    assert serves(executor, catalog["m0"])
    assert serves(executor, catalog["m1"])


def test_each_bypass_reason_is_logged_once_until_l2_caches_again(
    catalog: Catalog, make_executor: ExecutorFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="executor")
    size = catalog["m0"].size_bytes
    executor = make_executor(catalog, l2_budget_bytes=size // 2)

    def warnings() -> int:
        return sum("streaming L3 -> L1/L0 without caching" in r.getMessage() for r in caplog.records)

    executor.ensure("m0", Tier.L1)
    executor.ensure("m1", Tier.L1)
    assert warnings() == 1  # once per cause, not once per load

    executor.l2.budget.configured = 64 * MB  # room again (an operator grew the budget)
    executor.ensure("m2", Tier.L2)
    assert any("caches downloads again" in r.getMessage() for r in caplog.records)

    executor.l2.budget.configured = size // 2
    executor.evict("m0", Tier.L3)
    executor.ensure("m0", Tier.L1)
    assert warnings() == 2  # news again after L2 had recovered


def test_a_corrupt_stream_past_l2_is_refused_and_fetched_again(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    store = CorruptOnce()
    size = catalog["m0"].size_bytes
    executor = make_executor(catalog, stores={"file": store}, l2_budget_bytes=size // 2)
    failures = metric_delta("prewarm_executor_integrity_failures_total", {"tier": "L3"})

    with pytest.raises(IntegrityError, match="does not match"):
        executor.ensure("m0", Tier.L0)

    assert failures.delta == 1
    assert all(t.used_bytes == 0 for t in executor.state().tiers)  # nothing of it kept anywhere
    assert executor.ensure("m0", Tier.L0).served_from is Tier.L3  # the next load fetches it again
    assert serves(executor, catalog["m0"])


def test_an_unusable_l2_directory_leaves_l2_empty_and_loads_still_serve(
    tmp_path: Path, catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    not_a_directory = tmp_path / "a-file"
    not_a_directory.write_text("L2 was meant to be under here")
    executor = make_executor(catalog, cache_dir=not_a_directory / "cache")

    assert l2_capacity(executor) == 0
    with metric_delta(BYPASS, {"reason": "unusable"}) as unusable:
        assert executor.ensure("m0", Tier.L1).served_from is Tier.L3
    assert unusable.delta == 1
    assert serves(executor, catalog["m0"])


# ------------------------------------------------------------------------------- checkpoints


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[ModelSpec, Path]:
    root = tmp_path / "l3" / "org" / "llama"
    return synth_checkpoint(root, model_id="org/llama", shape=SMALL, shards=3), root


@pytest.mark.parametrize(("tier", "direct_l0"), TARGETS)
def test_a_checkpoint_l2_cannot_hold_streams_to_memory_with_its_small_files(
    checkpoint: tuple[ModelSpec, Path], make_executor: ExecutorFactory, tier: Tier, direct_l0: bool
) -> None:
    spec, root = checkpoint
    executor = make_executor(Catalog([spec]), l2_budget_bytes=spec.size_bytes // 2, direct_l0=direct_l0)
    with metric_delta(BYPASS, {"reason": "full"}) as full:
        result = executor.ensure(spec.id, tier)

    assert result.served_from is Tier.L3
    assert full.delta == 1
    assert nothing_in_l2(executor)
    assert serves_checkpoint(executor, spec, root)
    if tier is Tier.L1:
        # An engine gets the whole entry from the block: the shards and the small files it starts from.
        lease = executor.lease(spec.id)
        assert lease is not None
        try:
            block = lease.block.buffer.numpy()
            for f in spec.files:
                where = lease.files.file(f.path)
                assert where is not None
                assert (
                    bytes(block[where.offset : where.offset + where.length]) == (root / f.path).read_bytes()
                )
        finally:
            executor.release(lease.id)


def test_a_checkpoint_that_fails_l2_mid_download_starts_again_past_it(
    checkpoint: tuple[ModelSpec, Path], make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, root = checkpoint
    executor = make_executor(Catalog([spec]))
    tmp = executor.l2.root / "tmp"
    fault = failing(monkeypatch, "pwrite", tmp, errno.ENOSPC, times=1)
    with fault, metric_delta(BYPASS, {"reason": "no_space"}) as no_space:
        assert executor.ensure(spec.id, Tier.L0).served_from is Tier.L3
    assert no_space.delta == 1
    assert nothing_in_l2(executor)
    assert serves_checkpoint(executor, spec, root)


def test_a_corrupt_checkpoint_shard_past_l2_is_refused_and_fetched_again(
    checkpoint: tuple[ModelSpec, Path], make_executor: ExecutorFactory
) -> None:
    spec, root = checkpoint
    executor = make_executor(
        Catalog([spec]), stores={"file": CorruptOnce()}, l2_budget_bytes=spec.size_bytes // 2
    )
    with pytest.raises(IntegrityError, match="does not match"):
        executor.ensure(spec.id, Tier.L1)
    assert all(t.used_bytes == 0 for t in executor.state().tiers)
    assert executor.ensure(spec.id, Tier.L1).served_from is Tier.L3
    assert serves_checkpoint(executor, spec, root)


def test_a_checkpoint_from_s3_streams_past_a_full_l2(
    s3_endpoint: str,
    s3_bucket: str,
    checkpoint: tuple[ModelSpec, Path],
    unique: str,
    make_executor: ExecutorFactory,
) -> None:
    spec, root = checkpoint
    store = S3Store(s3_settings(s3_endpoint=s3_endpoint))
    store.ensure_bucket(s3_bucket)
    prefix = f"s3://{s3_bucket}/executor-tests/{unique}/llama/"
    for f in spec.files:
        store.put_file(root / f.path, prefix + f.path)
    on_s3 = spec.model_copy(update={"uri": prefix})
    executor = make_executor(
        Catalog([on_s3]), s3=s3_settings(s3_endpoint=s3_endpoint), l2_budget_bytes=spec.size_bytes // 2
    )
    with metric_delta(BYPASS, {"reason": "full"}) as full:
        assert executor.ensure(spec.id, Tier.L0).served_from is Tier.L3
    assert full.delta == 1
    assert nothing_in_l2(executor)
    assert serves_checkpoint(executor, on_s3, root)


def _l2_models(executor: Executor) -> set[str]:
    return {r.model for t in executor.state().tiers if t.tier is Tier.L2 for r in t.resident}


@pytest.mark.parametrize(("tier", "direct_l0"), TARGETS)
def test_a_load_through_a_full_l2_streams_past_rather_than_evict_a_copy_read_more_often(
    catalog: Catalog, make_executor: ExecutorFactory, tier: Tier, direct_l0: bool
) -> None:
    size = catalog["m0"].size_bytes
    executor = make_executor(catalog, l2_budget_bytes=2 * size + 10, direct_l0=direct_l0)
    for _ in range(3):
        executor.ensure("m0", Tier.L0, demand=True)  # three requests served here
    executor.ensure("m1", Tier.L2)  # m0, read from memory since, is L2's least recently used now
    with metric_delta(BYPASS, {"reason": "not_admitted"}) as declined:
        result = executor.ensure("m2", tier)

    assert result.served_from is Tier.L3
    assert declined.delta == 1
    assert _l2_models(executor) == {"m0", "m1"}
    assert serves(executor, catalog["m2"])
    # A prefetch into L2 itself is weighed the same way and fails; a request waiting for m2 in L2
    # takes its place, and LRU gives up m0 for it, however often m0 was read.
    with pytest.raises(CapacityError, match="not admitted"):
        executor.ensure("m2", Tier.L2)
    assert _l2_models(executor) == {"m0", "m1"}
    executor.ensure("m2", Tier.L2, demand=True)
    assert _l2_models(executor) == {"m1", "m2"}


def test_a_checkpoint_on_its_way_to_memory_is_declined_by_a_full_l2_the_same_way(
    checkpoint: tuple[ModelSpec, Path], catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    spec, root = checkpoint
    every_file = sum(f.size_bytes for f in spec.files)  # config and tokenizer too
    executor = make_executor(Catalog([*catalog, spec]), l2_budget_bytes=every_file + 10)
    executor.ensure("m0", Tier.L1, demand=True)
    executor.ensure("m0", Tier.L1, demand=True)
    with metric_delta(BYPASS, {"reason": "not_admitted"}) as declined:
        result = executor.ensure(spec.id, Tier.L1)

    assert result.served_from is Tier.L3
    assert declined.delta == 1
    assert _l2_models(executor) == {"m0"}
    assert serves_checkpoint(executor, spec, root)
