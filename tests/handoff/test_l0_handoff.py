"""L0 over the hand-off socket, and rank shards, on this CPU machine.

CUDA IPC itself needs a GPU (``deploy/gpu/check_executor.sh`` runs it in a second process). What runs
here: the cpu executor refuses an L0 request with its reason before anything is leased; the lease
semantics of share and copy mode (the same code on any device); the tensor table the socket sends,
rebuilt into every tensor from the shards' bytes; the handle's JSON form; and a rank's L1 shard over
the socket from a real client.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from executor import FileStore
from executor._ipc import describe, export, table_memfd
from models import Catalog
from prewarm import InvalidInput, Tier
from prewarm_client import (
    CudaIpcHandle,
    ProtocolError,
    Refused,
    TableEntry,
    TensorTable,
    open_weights,
)
from prewarm_client._ipc import tensors_from_table


def _split(two_models: Catalog) -> dict[str, Any]:
    """Settings under which m0 is held across two virtual GPUs."""
    return {"l0_gpus": 2, "l0_budget": float(two_models["m0"].size_bytes * 6 // 10)}


def _l0(executor: Any) -> dict[str, Any]:
    tier = executor.state().tier(Tier.L0)
    return {r.model: r for r in tier.resident}


def test_an_l0_request_to_a_cpu_executor_is_refused_with_its_reason_and_leases_nothing(
    serve: Any, two_models: Catalog
) -> None:
    executor, socket_dir = serve(two_models)
    for mode in ("share", "copy"):
        with pytest.raises(Refused, match="needs a CUDA executor") as refused:
            open_weights("m0", socket_dir=socket_dir, device="cuda:0", mode=mode)
        assert refused.value.reason == "mode"
    assert executor.device_leases() == []
    assert "m0" not in _l0(executor)  # refused before anything was loaded for it


def test_a_mode_is_only_for_a_cuda_device(serve: Any, two_models: Catalog) -> None:
    _executor, socket_dir = serve(two_models)
    with pytest.raises(ValueError, match="mode"):
        open_weights("m0", socket_dir=socket_dir, device="cpu", mode="share")
    with pytest.raises(ValueError, match="mode"):
        open_weights("m0", socket_dir=socket_dir, device="cuda", mode="move")


def test_each_rank_takes_only_its_own_shards_tensors_from_l1(serve: Any, two_models: Catalog) -> None:
    executor, socket_dir = serve(two_models, **_split(two_models))
    executor.ensure("m0", Tier.L0)  # held across two GPUs: the ranks are its shards
    expected = load_file(str(FileStore.path(two_models["m0"].uri)))
    model = executor.l0.cache.lookup(two_models["m0"].key, use=False)
    assert model is not None
    assert len(model.shards) == 2

    names: list[set[str]] = []
    for rank in (0, 1):
        with open_weights("m0", socket_dir=socket_dir, rank=rank) as weights:
            assert all(torch.equal(weights[n], expected[n]) for n in weights)
            names.append(set(weights))
    assert names[0].isdisjoint(names[1])
    assert names[0] | names[1] == set(expected)
    # The split is the L0 one: rank 0's tensors are those that start in shard 0.
    assert model.layout is not None
    shard0 = {t.name for t in model.layout.tensors if t.start < model.shards[0].end}
    assert names[0] == shard0


def test_a_rank_the_model_does_not_have_is_refused(serve: Any, two_models: Catalog) -> None:
    _executor, socket_dir = serve(two_models, **_split(two_models))
    with pytest.raises(Refused) as refused:
        open_weights("m0", socket_dir=socket_dir, rank=2)
    assert refused.value.reason == "rank"


def test_copy_mode_frees_the_l0_copy_once_the_engine_has_it_and_share_mode_keeps_it(
    serve: Any, two_models: Catalog
) -> None:
    executor, _socket_dir = serve(two_models)
    shared = executor.lease_device("m0", mode="share")
    assert shared is not None
    assert _l0(executor)["m0"].leases == 1
    assert _l0(executor)["m0"].lease_wait_s is not None
    assert executor.release(shared.id)
    assert "m0" in _l0(executor)  # share: the executor's copy was the engine's, and stays

    copied = executor.lease_device("m0", mode="copy")
    assert copied is not None
    assert executor.release(copied.id, copied=True)
    assert "m0" not in _l0(executor)  # copy: the engine has its own now
    assert executor.l2.lookup(two_models["m0"].sha256 or "") is not None  # the lower tiers keep theirs


def test_a_copy_mode_engine_that_goes_away_without_its_copy_leaves_the_l0_copy(
    serve: Any, two_models: Catalog
) -> None:
    executor, _socket_dir = serve(two_models)
    lease = executor.lease_device("m0", mode="copy")
    assert lease is not None
    assert executor.release(lease.id)  # connection lost: no "copied"
    assert "m0" in _l0(executor)


def test_a_leased_l0_copy_is_not_evicted_by_an_order_until_the_lease_ends(
    serve: Any, two_models: Catalog
) -> None:
    executor, _socket_dir = serve(two_models)
    lease = executor.lease_device("m0")
    assert lease is not None
    executor.evict("m0", Tier.L0)
    assert "m0" in _l0(executor)
    executor.release(lease.id)
    executor.evict("m0", Tier.L0)
    assert "m0" not in _l0(executor)


def test_the_tensor_table_rebuilds_every_tensor_from_the_shards_bytes(
    serve: Any, two_models: Catalog
) -> None:
    executor, _socket_dir = serve(two_models, **_split(two_models))
    lease = executor.lease_device("m0")
    assert lease is not None
    try:
        shards, table = describe(lease)
        assert [s.rank for s in shards] == [0, 1]
        fd, length = table_memfd(table)  # as the socket sends it: a read-only memfd
        try:
            data = b"".join(iter(lambda: os.read(fd, 1 << 16), b""))
        finally:
            os.close(fd)
        assert len(data) == length
        parsed = TensorTable.from_bytes(data, {s.rank: s.end - s.start for s in shards})
        bases = {s.rank: s.buffer for s in lease.shards}  # what CUDA IPC maps in the engine
        rebuilt = dict(tensors_from_table(parsed, bases))
        expected = load_file(str(FileStore.path(two_models["m0"].uri)))
        assert rebuilt.keys() == expected.keys()
        assert all(torch.equal(rebuilt[n], expected[n]) for n in expected)
        with pytest.raises(InvalidInput, match="CUDA executor"):
            export(lease)  # cpu memory cannot be handed over as CUDA IPC handles
    finally:
        executor.release(lease.id)


def test_a_tensor_table_that_points_outside_its_shard_is_refused() -> None:
    table = TensorTable((TableEntry("w", "F32", (4, 4), 0, 32),))
    with pytest.raises(ProtocolError, match="outside shard 0"):
        TensorTable.from_bytes(table.to_bytes(), {0: 64})
    with pytest.raises(ProtocolError, match="outside shard"):
        TensorTable.from_bytes(table.to_bytes(), {1: 4096})
    assert TensorTable.from_bytes(table.to_bytes(), {0: 96}) == table


def test_a_cuda_ipc_handle_travels_as_json_and_is_checked() -> None:
    shared = (0, b"\x01\x02handle", 1 << 20, 512, b"/torch_123_456", 7, b"\x09event", True)
    handle = CudaIpcHandle.from_share_cuda(shared, offset=256, length=4096, uuid="GPU-abc")
    again = CudaIpcHandle.from_json(json.loads(json.dumps(handle.to_json())))
    assert again == handle
    body = handle.to_json()
    body["length"] = 1 << 21
    with pytest.raises(ProtocolError, match="outside its storage"):
        CudaIpcHandle.from_json(body)
    body = handle.to_json()
    body["handle"] = "not base64!"
    with pytest.raises(ProtocolError, match="base64"):
        CudaIpcHandle.from_json(body)


def test_a_rank_of_a_model_only_in_l1_gets_the_shard_l0_would_give_it(
    serve: Any, two_models: Catalog
) -> None:
    executor, socket_dir = serve(two_models, **_split(two_models))
    spec = two_models["m0"]
    executor.ensure("m0", Tier.L1)
    with open_weights("m0", socket_dir=socket_dir, rank=1) as weights:
        in_l1 = set(weights)
    assert "m0" not in _l0(executor)
    executor.ensure("m0", Tier.L0)
    model = executor.l0.cache.lookup(spec.key, use=False)
    assert model is not None
    assert model.layout is not None
    assert in_l1 == {t.name for t in model.layout.tensors if t.start >= model.shards[1].start}
