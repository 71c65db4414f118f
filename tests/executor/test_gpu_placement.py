"""Per-GPU L0: one executor drives every GPU of its node. On this machine the cpu device stands in with
``l0_gpus`` virtual GPUs, each with its own budget, through the same placement code as CUDA."""

from __future__ import annotations

import itertools
import time

import torch
from executor_testkit import ExecutorFactory, serves
from hypothesis import given
from hypothesis import strategies as st

from executor import Executor
from executor._l0 import DeviceModel, Shard, split_by_tensors
from executor._pipeline import DeviceCopier
from executor._safetensors import Layout, TensorEntry
from models import Catalog
from prewarm import ExecutorState, Order, OrderAction, OrderReason, OrderStatus, ResidentModel, Tier


def _l0(state: ExecutorState) -> dict[str, ResidentModel]:
    l0 = state.tier(Tier.L0)
    assert l0 is not None
    return {r.model: r for r in l0.resident}


def _assert_per_gpu_sums_to_l0(executor: Executor) -> ExecutorState:
    state = executor.state()
    l0 = state.tier(Tier.L0)
    assert l0 is not None
    assert sum(g.used_bytes for g in state.gpus) == l0.used_bytes
    assert sum(g.capacity_bytes for g in state.gpus) == l0.capacity_bytes
    assert all(g.used_bytes <= g.capacity_bytes for g in state.gpus)
    return state


def test_a_model_larger_than_one_gpu_is_held_across_two_with_every_tensor_whole_on_one(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    size = catalog["m0"].size_bytes
    executor = make_executor(catalog, l0_gpus=3, l0_budget=float(size * 6 // 10))

    executor.ensure("m0", Tier.L0)

    state = _assert_per_gpu_sums_to_l0(executor)
    assert len(_l0(state)["m0"].gpus) == 2
    used = {g.index: g.used_bytes for g in state.gpus}
    assert sorted(used.values())[0] == 0
    assert sum(used.values()) == size
    model = executor.l0.cache.pin(catalog["m0"].key)
    assert model is not None
    try:
        assert [s.rank for s in model.shards] == [0, 1]
        assert model.shards[0].end == model.shards[1].start  # contiguous, cut at a tensor boundary
        assert model.layout is not None
        starts = {t.start for t in model.layout.tensors}
        assert model.shards[1].start in starts
        for entry in model.layout.tensors:
            owner = model.shard_at(entry.start)
            assert owner.start <= entry.start
            assert entry.end <= owner.end
    finally:
        executor.l0.cache.unpin(catalog["m0"].key)
    assert serves(executor, catalog["m0"])


def test_two_models_that_cannot_share_a_gpu_go_to_different_gpus(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    size = max(spec.size_bytes for spec in catalog)
    executor = make_executor(catalog, l0_gpus=2, l0_budget=float(size * 15 // 10))

    executor.ensure("m0", Tier.L0)
    executor.ensure("m1", Tier.L0)

    resident = _l0(_assert_per_gpu_sums_to_l0(executor))
    assert set(resident) == {"m0", "m1"}  # nothing was evicted to make room
    assert sorted([resident["m0"].gpus, resident["m1"].gpus]) == [[0], [1]]
    assert serves(executor, catalog["m0"])
    assert serves(executor, catalog["m1"])


def test_an_orders_gpus_are_where_the_copy_goes(catalog: Catalog, make_executor: ExecutorFactory) -> None:
    size = max(spec.size_bytes for spec in catalog)
    executor = make_executor(catalog, l0_gpus=2, l0_budget=float(size * 3))
    now = time.time()
    order = Order(
        id="o-1",
        node=executor.settings.node_name,
        model="m1",
        version=catalog["m1"].version,
        sha256=catalog["m1"].sha256,
        action=OrderAction.PREFETCH,
        tier=Tier.L0,
        reason=OrderReason.FORECAST,
        not_before=now,
        deadline=now + 60,
        created_at=now,
        gpus=[1],
    )

    assert executor.apply(order).status is OrderStatus.DONE

    state = _assert_per_gpu_sums_to_l0(executor)
    assert _l0(state)["m1"].gpus == [1]
    assert {g.index: g.used_bytes for g in state.gpus} == {0: 0, 1: catalog["m1"].size_bytes}


def test_a_copy_placed_on_a_full_gpu_evicts_only_what_that_gpu_holds(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    size = max(spec.size_bytes for spec in catalog)
    executor = make_executor(catalog, l0_gpus=2, l0_budget=float(size * 15 // 10))
    executor.ensure("m0", Tier.L0, gpus=[1])  # the least recently used copy, on GPU 1
    executor.ensure("m1", Tier.L0, gpus=[0])

    executor.ensure("m2", Tier.L0, gpus=[0])

    resident = _l0(_assert_per_gpu_sums_to_l0(executor))
    assert set(resident) == {"m0", "m2"}  # m0 is older, but on the other GPU: it stays
    assert resident["m2"].gpus == [0]
    assert resident["m0"].gpus == [1]


def test_an_engine_rank_leases_the_bytes_of_its_own_shard(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    spec = catalog["m0"]
    executor = make_executor(catalog, l0_gpus=2, l0_budget=float(spec.size_bytes * 6 // 10))
    executor.ensure("m0", Tier.L0)
    model = executor.l0.cache.pin(spec.key)
    assert model is not None
    executor.l0.cache.unpin(spec.key)

    leases = [executor.lease("m0", rank=r) for r in (0, 1)]

    assert [lease.shard for lease in leases if lease] == [(s.start, s.end) for s in model.shards]
    device = executor.lease_device("m0", rank=1)
    assert device is not None
    assert [s.rank for s in device.shards] == [1]
    for lease in leases:
        assert lease is not None
        assert executor.release(lease.id)
    assert executor.release(device.id)


def test_state_reports_one_gpu_and_its_residents_on_the_default_cpu_stand_in(
    catalog: Catalog, make_executor: ExecutorFactory
) -> None:
    executor = make_executor(catalog)
    executor.ensure("m0", Tier.L0)
    state = _assert_per_gpu_sums_to_l0(executor)
    assert [g.index for g in state.gpus] == [0]
    assert _l0(state)["m0"].gpus == [0]


def _layout(sizes: list[int]) -> Layout:
    entries, cursor = [], 8 + 16
    for i, n in enumerate(sizes):
        entries.append(TensorEntry(f"t{i}", "U8", (n,), cursor, cursor + n))
        cursor += n
    return Layout(16, cursor, tuple(entries), {})


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=40), st.integers(1, 8))
def test_shards_are_contiguous_cut_at_tensors_and_within_a_tensor_of_even(
    sizes: list[int], ranks: int
) -> None:
    layout = _layout(sizes)
    ranges = split_by_tensors(layout, layout.file_bytes, ranks)
    assert ranges[0][0] == 0
    assert ranges[-1][1] == layout.file_bytes
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert len(ranges) == min(ranks, len(sizes))
    starts = {t.start for t in layout.tensors}
    assert all(lo in starts for lo, _ in ranges[1:])
    even = layout.file_bytes / len(ranges)
    assert all(abs((hi - lo) - even) <= 2 * max(sizes) + 24 for lo, hi in ranges)


def test_a_copy_that_spans_shards_is_split_between_their_buffers_as_on_several_gpus() -> None:
    # The CUDA structure of a model across GPUs (one buffer per shard, no flat buffer), on the cpu.
    layout = _layout([100, 300, 50, 650])
    ranges = split_by_tensors(layout, layout.file_bytes, 2)
    shards = tuple(
        Shard(rank, rank, lo, hi, torch.zeros(hi - lo, dtype=torch.uint8))
        for rank, (lo, hi) in enumerate(ranges)
    )
    model = DeviceModel(shards, layout.file_bytes)
    source = torch.randint(0, 255, (layout.file_bytes,), dtype=torch.uint8)
    copier = DeviceCopier(model.segments())
    for start in range(0, layout.file_bytes, 128):  # chunks that straddle the shard boundary
        copier.copy(source[start : start + 128], start)
    copier.finish()

    back = torch.empty_like(source)
    model.copy_to(back)
    assert torch.equal(back, source)
    assert torch.equal(model.flat()[90:700], source[90:700])  # gathered across both shards
    views = model.views(layout)
    for entry in layout.tensors:
        assert torch.equal(views[entry.name], source[entry.start : entry.end])
