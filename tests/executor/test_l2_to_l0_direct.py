"""L2 → L0 on the CPU device: chunks land straight in the L0 buffer, still checked chunk by chunk."""

from __future__ import annotations

import os
from typing import Any

import pytest
from executor_testkit import CHUNK, ExecutorFactory, flip_byte, serves

from executor import FileStore
from executor import _hops as hops_module
from executor._l2 import L2Reader
from executor._tier import ALIGN, round_up
from models import Catalog
from prewarm import IntegrityError, PrewarmError, Tier


def _forbid(name: str) -> Any:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(f"{name} used on the CPU device's L2 -> L0 path")

    return refuse


def test_cpu_l2_to_l0_reads_straight_into_the_device_buffer(
    catalog: Catalog, make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = catalog["m2"]
    # No intermediate of any size: no staging ring, no host-to-device copier, no L1 block.
    executor = make_executor(catalog, staging_ring=_forbid("a staging ring"))
    executor.ensure("m2", Tier.L2)
    reads: list[tuple[int, int]] = []
    read_chunk = L2Reader.read_chunk

    def spy(self: L2Reader, index: int, out: memoryview, out_address: int) -> int:
        reads.append((out_address, len(out)))
        return read_chunk(self, index, out, out_address)

    monkeypatch.setattr(L2Reader, "read_chunk", spy)
    monkeypatch.setattr(hops_module, "DeviceCopier", _forbid("a device copy"))

    result = executor.ensure("m2", Tier.L0, demand=True)

    assert result.served_from is Tier.L2
    assert set(result.seconds_per_hop) == {"L2->L0"}
    used = {t.tier: t.used_bytes for t in executor.state().tiers}
    assert used[Tier.L1] == 0
    assert used[Tier.L0] == spec.size_bytes
    assert executor.l1.pool.allocations == 0  # no L1 block was ever allocated
    model = executor.l0.cache.pin(spec.key)
    assert model is not None
    try:
        base = model.buffer.data_ptr()
        assert base % ALIGN == 0  # so the reads can be O_DIRECT
        assert len(reads) == -(-spec.size_bytes // CHUNK)
        # Every chunk was read into the L0 buffer itself (the last one into its slack to the next page).
        end = base + round_up(spec.size_bytes)
        assert all(base <= address and address + n <= end for address, n in reads)
        assert sorted(address - base for address, _ in reads) == list(range(0, spec.size_bytes, CHUNK))
    finally:
        executor.l0.cache.unpin(spec.key)
    assert serves(executor, spec)

    # L1 is filled only when asked for, from the L0 copy: no second disk read.
    monkeypatch.undo()
    reads.clear()
    filled = executor.ensure("m2", Tier.L1)
    assert filled.served_from is Tier.L0
    assert set(filled.seconds_per_hop) == {"L0->L1"}


def test_cpu_l2_to_l0_still_catches_a_flipped_byte(catalog: Catalog, make_executor: ExecutorFactory) -> None:
    spec = catalog["m0"]
    executor = make_executor(catalog)
    executor.ensure("m0", Tier.L2)
    assert spec.sha256 is not None
    flip_byte(executor.l2.object_path(spec.sha256), CHUNK + CHUNK // 2)  # inside a tensor, second chunk

    result = executor.ensure("m0", Tier.L0)

    assert result.served_from is Tier.L3  # the L2 copy failed its chunk digest and was fetched again
    assert serves(executor, spec)
    assert executor.verify()[0].ok


def test_cpu_l2_to_l0_with_a_flipped_byte_leaves_nothing_visible(
    catalog: Catalog, make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = catalog["m1"]
    executor = make_executor(catalog)
    executor.ensure("m1", Tier.L2)
    assert spec.sha256 is not None
    flip_byte(executor.l2.object_path(spec.sha256), spec.size_bytes - CHUNK // 2)  # the last chunk
    failures: list[IntegrityError] = []
    read_chunk = L2Reader.read_chunk

    def spy(self: L2Reader, index: int, out: memoryview, out_address: int) -> int:
        try:
            return read_chunk(self, index, out, out_address)
        except IntegrityError as exc:
            failures.append(exc)
            raise

    monkeypatch.setattr(L2Reader, "read_chunk", spy)
    os.unlink(FileStore.path(spec.uri))  # and L3 cannot give it again

    with pytest.raises(PrewarmError):
        executor.ensure("m1", Tier.L0, demand=True)

    assert len(failures) == 1
    assert "digest mismatch" in str(failures[0])
    used = {t.tier: t.used_bytes for t in executor.state().tiers}
    assert used[Tier.L0] == 0
    assert used[Tier.L1] == 0
    assert executor.l0.cache.lookup(spec.key) is None
