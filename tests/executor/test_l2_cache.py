"""The disk tier: verified on entry and on every read, crash-safe, and it survives restarts."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import torch
from executor_testkit import CHUNK, ExecutorFactory, flip_byte, make_model, s3_settings, serves

from executor import FileStore
from executor._hostmem import host_buffer, populate
from executor._l2 import ChunkDigester, L2Cache, L2Reader, PartWrite
from executor._pipeline import host_view
from executor._stores import OnPiece
from executor._tier import round_up
from models import Catalog, ModelSpec
from prewarm import IntegrityError, ObjectStoreError, StorageError, Tier


def _l2_path(executor: object, spec: ModelSpec) -> Path:
    assert spec.sha256 is not None
    return executor.l2.object_path(spec.sha256)  # type: ignore[attr-defined,no-any-return]


def test_flipped_byte_in_l2_is_refetched_from_l3(catalog: Catalog, make_executor: ExecutorFactory) -> None:
    executor = make_executor(catalog)
    spec = catalog["m0"]
    assert executor.ensure("m0", Tier.L2).served_from is Tier.L3
    flip_byte(_l2_path(executor, spec), spec.size_bytes - CHUNK // 2)  # inside a tensor, last chunk

    result = executor.ensure("m0", Tier.L0)

    assert result.served_from is Tier.L3  # the L2 copy failed its chunk digest
    assert serves(executor, spec)
    # The re-fetched L2 copy is good again.
    assert executor.verify()[0].ok


def test_flipped_byte_in_an_l2_header_is_refetched_too(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    executor.ensure("m1", Tier.L2)
    flip_byte(_l2_path(executor, catalog["m1"]), 20)  # inside the JSON header

    assert executor.ensure("m1", Tier.L1).served_from is Tier.L3
    assert executor.verify()[0].ok


def test_verify_rehashes_everything_and_evicts_corrupt_objects(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    for model in ("m0", "m1"):
        executor.ensure(model, Tier.L2)
    flip_byte(_l2_path(executor, catalog["m1"]), 100)

    results = {r.model: r for r in executor.verify()}

    assert results["m0"].ok
    assert not results["m1"].ok
    assert not _l2_path(executor, catalog["m1"]).exists()
    assert executor.ensure("m1", Tier.L2).served_from is Tier.L3


def test_index_survives_a_restart(catalog: Catalog, make_executor: ExecutorFactory, tmp_path: Path) -> None:
    first = make_executor(catalog, cache_dir=tmp_path / "c")
    first.ensure("m0", Tier.L2)
    first.ensure("m1", Tier.L1)
    first.close()

    second = make_executor(catalog, cache_dir=tmp_path / "c")

    assert second.ensure("m0", Tier.L1).served_from is Tier.L2
    assert second.ensure("m1", Tier.L2).served_from is Tier.L2
    index = json.loads((tmp_path / "c" / "index.json").read_text())
    assert index["version"] == 2
    assert len(index["objects"]) == 2


def test_index_of_an_unknown_version_is_refused(
    catalog: Catalog, make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    cache.mkdir()
    (cache / "index.json").write_text(json.dumps({"version": 99, "objects": {}}))
    with pytest.raises(StorageError, match="version 99"):
        make_executor(catalog, cache_dir=cache)


def test_leftovers_of_a_crash_are_cleaned_at_start(
    catalog: Catalog, make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    make_executor(catalog, cache_dir=cache).ensure("m0", Tier.L2)
    orphan = cache / "objects" / "ab" / ("ab" + "0" * 62)  # renamed but never indexed
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"x")
    part = cache / "tmp" / f"{'cd' * 32}.{os.getpid()}.part"  # a download whose process died
    part.write_bytes(b"partial")

    executor = make_executor(catalog, cache_dir=cache)

    assert not orphan.exists()
    assert not part.exists()
    assert executor.ensure("m0", Tier.L2).served_from is Tier.L2


class _DyingStore(FileStore):
    """Serves the first ``budget`` ranges, then fails like a server that went away (until the budget is
    set to None: the server is back)."""

    def __init__(self, budget: int) -> None:
        self.budget: int | None = budget

    def read_range_into(
        self, uri: str, start: int, dest: memoryview, on_piece: OnPiece | None = None
    ) -> None:
        if self.budget is not None:
            self.budget -= 1
            if self.budget < 0:
                raise ObjectStoreError("store went away", transient=True)
        super().read_range_into(uri, start, dest, on_piece)


def test_failed_download_leaves_nothing_visible_and_budgets_whole(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    store = _DyingStore(budget=3)
    executor = make_executor(catalog, stores={"file": store})

    with pytest.raises(ObjectStoreError):
        executor.ensure("m0", Tier.L0)

    assert all(t.used_bytes == 0 for t in executor.state().tiers)
    assert not any(p.is_file() for p in (executor.l2.root / "objects").rglob("*"))
    assert not list((executor.l2.root / "tmp").iterdir())
    store.budget = None
    assert executor.ensure("m0", Tier.L0).served_from is Tier.L3


def test_wrong_sha256_in_l3_is_never_cached(weights_dir: Path, make_executor: ExecutorFactory) -> None:
    good = make_model(weights_dir, "m", seed=1)
    lying = good.model_copy(update={"sha256": "f" * 64})
    executor = make_executor(Catalog([lying]))

    with pytest.raises(IntegrityError, match="does not match"):
        executor.ensure("m", Tier.L1)

    assert all(t.used_bytes == 0 for t in executor.state().tiers)
    assert not any(p.is_file() for p in (executor.l2.root / "objects").rglob("*"))


def test_l2_budget_evicts_least_recently_used(catalog: Catalog, make_executor: ExecutorFactory) -> None:
    size = catalog["m0"].size_bytes
    executor = make_executor(catalog, l2_budget_bytes=2 * size + 10)
    executor.ensure("m0", Tier.L2)
    executor.ensure("m1", Tier.L2)
    executor.ensure("m0", Tier.L1)  # m0 used again: m1 is now the least recently used
    executor.ensure("m2", Tier.L2)

    resident = {r.model for r in executor.state().tiers[2].resident}
    assert resident == {"m0", "m2"}
    assert executor.state().tiers[2].used_bytes <= 2 * size + 10


@pytest.mark.parametrize("how", ["refused", "disabled"])
def test_reads_fall_back_to_buffered_where_o_direct_is_refused(
    catalog: Catalog, make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    executor = make_executor(catalog, l2_direct_io=how == "refused")
    executor.ensure("m0", Tier.L2)
    if how == "refused":
        # What tmpfs on older kernels and some overlay filesystems answer to O_DIRECT.
        real_open = os.open

        def no_direct(path: object, flags: int, *args: object) -> int:
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_open(path, flags, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", no_direct)
    obj = executor.l2.lookup(catalog["m0"].sha256 or "")
    assert obj is not None
    if how == "refused":
        with L2Reader(obj, direct=True) as reader:
            assert not reader.direct  # asked for O_DIRECT, fell back to buffered reads

    assert executor.ensure("m0", Tier.L0).served_from is Tier.L2
    assert serves(executor, catalog["m0"])


def test_unaligned_destination_is_read_buffered_and_still_checked(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    executor.ensure("m0", Tier.L2)
    obj = executor.l2.lookup(catalog["m0"].sha256 or "")
    assert obj is not None
    buffer = bytearray(obj.chunk_bytes + 4096 + 1)
    view = memoryview(buffer)[1:]  # one byte off any alignment
    with L2Reader(obj, direct=True) as reader:
        n = reader.read_chunk(0, view, 1)
    assert bytes(view[:n]) == FileStore.path(catalog["m0"].uri).read_bytes()[:n]


@pytest.mark.parametrize(
    ("direct_io", "part_bytes"),
    [(True, CHUNK), (True, CHUNK + 1), (False, CHUNK)],
    ids=["o-direct", "unaligned-parts-buffered", "buffered"],
)
def test_downloads_land_in_l2_byte_exact_with_or_without_o_direct(
    catalog: Catalog, make_executor: ExecutorFactory, direct_io: bool, part_bytes: int
) -> None:
    executor = make_executor(catalog, l2_direct_io=direct_io, s3=s3_settings(s3_part_bytes=part_bytes))
    spec = catalog["m0"]
    assert spec.size_bytes % 4096  # the last part is rounded up for O_DIRECT and truncated back

    executor.ensure("m0", Tier.L1)  # L3 → L1 and L2 in one pass
    executor.ensure("m1", Tier.L2)  # L3 → L2 alone, through scratch buffers

    for model in ("m0", "m1"):
        path = _l2_path(executor, catalog[model])
        assert path.read_bytes() == FileStore.path(catalog[model].uri).read_bytes()
    assert all(r.ok for r in executor.verify())


def test_a_retried_range_rewrites_its_part_and_the_file_stays_exact(tmp_path: Path) -> None:
    l2 = L2Cache(tmp_path / "cache", 2**30, chunk_bytes=CHUNK, clock=time.monotonic)
    data = os.urandom(3 * 2**20 + 123)  # a direct run, a second one, and an unaligned tail
    sha = hashlib.sha256(data).hexdigest()
    buffer = host_buffer(round_up(len(data)))
    view, address = host_view(buffer)
    tw = l2.begin(sha, len(data), model="m", version="1")
    assert tw.direct_fd is not None  # ext4: the temp file takes O_DIRECT
    part = PartWrite(l2, tw, 0, len(data), view, address)

    view[: 2**20 + 5] = b"\0" * (2**20 + 5)  # a first attempt lands garbage, then the connection drops
    part.landed(0, 2**20 + 5)
    view[: len(data)] = data  # the retry starts again from byte 0
    part.landed(0, 2**20)
    part.landed(2**20, len(data))
    part.finish()
    digester = ChunkDigester(CHUNK)
    digester.update(data)
    obj = l2.publish(tw, sha, digester.finish())

    assert obj.path.read_bytes() == data


def test_host_buffers_are_page_aligned_and_populate_keeps_their_contents() -> None:
    buffer = host_buffer(5 * 4096 + 7)
    assert buffer.numel() == 5 * 4096 + 7
    assert buffer.data_ptr() % 4096 == 0
    buffer[:] = torch.arange(buffer.numel(), dtype=torch.uint8)
    before = buffer.clone()
    populate(buffer)
    tail = buffer[4096:]
    del buffer  # a view keeps the mapping alive
    assert torch.equal(tail, before[4096:])


def test_an_unaligned_part_boundary_never_overwrites_the_next_part(tmp_path: Path) -> None:
    l2 = L2Cache(tmp_path / "cache", 2**30, chunk_bytes=CHUNK, clock=time.monotonic)
    data = os.urandom(2 * 2**20 + 10)
    cut = 2**20 + 1  # parts of an unaligned size: only the object's end may be rounded up
    sha = hashlib.sha256(data).hexdigest()
    tw = l2.begin(sha, len(data), model="m", version="1")
    for start, end in ((cut, len(data)), (0, cut)):  # the second part lands first
        buffer = host_buffer(round_up(end - start))  # scratch memory: zeros past the part's end
        view, address = host_view(buffer)
        view[: end - start] = data[start:end]
        part = PartWrite(l2, tw, start, end - start, view, address)
        part.landed(0, end - start)
        part.finish()
    digester = ChunkDigester(CHUNK)
    digester.update(data)

    assert l2.publish(tw, sha, digester.finish()).path.read_bytes() == data


def test_lru_order_survives_a_restart(
    catalog: Catalog, make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    budget = 2 * catalog["m0"].size_bytes + 10
    first = make_executor(catalog, cache_dir=tmp_path / "c", l2_budget_bytes=budget)
    first.ensure("m0", Tier.L2)
    first.ensure("m1", Tier.L2)
    first.ensure("m0", Tier.L2)  # m0 used again: m1 is the least recently used
    first.close()

    second = make_executor(catalog, cache_dir=tmp_path / "c", l2_budget_bytes=budget)
    second.ensure("m2", Tier.L2)

    assert {r.model for r in second.state().tiers[2].resident} == {"m0", "m2"}


def test_processes_sharing_a_cache_directory_share_its_budget(
    weights_dir: Path, make_executor: ExecutorFactory, tmp_path: Path
) -> None:
    catalog = Catalog(make_model(weights_dir, f"s{i}", seed=i) for i in range(4))
    budget = 3 * max(spec.size_bytes for spec in catalog) + 10
    shared = tmp_path / "shared"
    # Two executors on one directory, each with its own accounting, as two processes on a node would be.
    a = make_executor(catalog, cache_dir=shared, l2_budget_bytes=budget)
    b = make_executor(catalog, cache_dir=shared, l2_budget_bytes=budget)

    def on_disk() -> int:
        return sum(p.stat().st_size for p in (shared / "objects").glob("*/*"))

    a.ensure("s0", Tier.L2)
    a.ensure("s1", Tier.L2)
    b.ensure("s2", Tier.L2)
    b.ensure("s3", Tier.L2)  # a fourth object: the directory's least recently used (s0, a's) goes

    assert on_disk() <= budget
    assert not _l2_path(a, catalog["s0"]).exists()
    assert a.ensure("s0", Tier.L1).served_from is Tier.L3  # a finds its copy gone and fetches it again
    assert on_disk() <= budget
    assert {r.model for r in a.state().tiers[2].resident} <= {"s0", "s2", "s3"}  # s1 made room
    assert all(r.ok for r in b.verify())


def test_a_model_served_from_memory_stays_recent_in_l2(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    size = catalog["m0"].size_bytes
    executor = make_executor(catalog, l2_budget_bytes=2 * size + 10)
    executor.ensure("m0", Tier.L0, demand=True)
    executor.ensure("m1", Tier.L2)
    with executor.acquire("m0"):  # a request served from GPU memory, L2 not read
        pass
    executor.ensure("m2", Tier.L2, demand=True)

    resident = {r.model for r in executor.state().tiers[2].resident}
    assert resident == {"m0", "m2"}  # m1 was the least recently used, though read from L2 later


def test_a_disk_copy_a_request_downloaded_is_reported_used_and_one_staged_on_a_guess_is_not(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    executor.ensure("m0", Tier.L1, demand=True)
    executor.ensure("m1", Tier.L2)
    disk = {r.model: r for r in executor.state().tiers[2].resident}
    assert disk["m0"].last_used is not None  # the planner may displace it for a guess
    assert disk["m1"].last_used is None  # a guess no load has read: displaced for a request only
