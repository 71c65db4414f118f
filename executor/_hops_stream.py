"""A checkpoint L3 → L1/L0 past L2, for a load that L2 cannot take (a full or failing disk).

Normally a checkpoint comes to L2 as one verified directory and goes up from there (``_hops``). When L2
cannot take it (``_l2_faults``), ``CheckpointStream`` brings it from L3 straight into the buffer of the
tier asked for, the way a single file streams past L2 (``_pipeline.stream_l3``): the shards one after
the other at their aligned offsets (an L1 block, or on the CPU device the L0 buffer itself), each
checked against its sha256 as it lands, and on to the device part by part when the load is for L0 and
goes through L1; the small files (config, tokenizer) into the block after the weights, checked too; the
index checked against the shards. Nothing is visible until all of it is (``DeviceHops.commit``).

A model that L1 cannot hold cannot stream to L0 on CUDA (the staging ring reads from L2): that load
fails with ``CapacityError``, saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from executor._checkpoints import combined_layout, probe_checkpoint, stream_checkpoint
from executor._hops_l0 import DeviceHops
from executor._l0 import DeviceModel, L0Cache
from executor._l1 import HostBlock, L1Cache, block_files
from executor._pipeline import DeviceCopier, host_view
from executor._priority import LinkGate
from executor._result import HopTimer
from executor._safetensors import Layout
from executor._stores import ObjectStore
from executor._tier import ModelKey
from models import ModelSpec
from prewarm import CapacityError, S3Settings, Tier
from prewarm_client import BlockLayout

__all__ = ["CheckpointStream"]


class CheckpointStream:
    """Checkpoints from L3 into L1/L0 without L2. ``is_demand`` as in ``DeviceHops``."""

    def __init__(
        self,
        *,
        l0: L0Cache,
        l1: L1Cache,
        device: DeviceHops,
        gate: LinkGate,
        pool: ThreadPoolExecutor,
        s3: S3Settings,
        direct_l0: bool,
        is_demand: Callable[[ModelKey, bool], Callable[[], bool]],
    ) -> None:
        self.l0, self.l1 = l0, l1
        self._device = device
        self._gate = gate
        self._pool = pool
        self._s3 = s3
        self._direct_l0 = direct_l0
        self._is_demand = is_demand

    def load(
        self,
        spec: ModelSpec,
        store: ObjectStore,
        tier: Tier,
        hops: HopTimer,
        demand: bool,
        gpus: tuple[int, ...],
        why: BaseException,
    ) -> None:
        """Bring ``spec`` to ``tier`` (L1 or L0) from L3; ``why``: what kept L2 from taking it."""
        key = spec.key
        layouts = probe_checkpoint(store, spec)  # validated before anything is reserved
        weights = spec.weight_files()
        layout, offsets = combined_layout([layouts[f.path] for f in weights])
        files = sorted(spec.files, key=lambda f: f.path)
        small = [(f.path, f.size_bytes) for f in files if f.path not in layouts]
        plan = block_files([(f.path, o, f.size_bytes) for f, o in zip(weights, offsets, strict=True)], small)
        block: HostBlock | None = None
        device_model: DeviceModel | None = None
        try:
            if tier is not Tier.L0 or not self._direct_l0:
                try:
                    block = self.l1.reserve(
                        key, layout.file_bytes, prefetched=not demand, block_bytes=plan.size
                    )
                except CapacityError as exc:
                    if tier is not Tier.L0:
                        raise
                    raise CapacityError(
                        f"{spec.id}: L2 cannot cache it ({why}) and L1 cannot hold it on its way to L0: {exc}"
                    ) from exc
            if tier is Tier.L0:
                device_model = self.l0.reserve(
                    key, layout.file_bytes, prefetched=not demand, layout=layout, gpus=gpus
                )
            self._fill(spec, store, block, device_model, layouts, offsets, plan, hops, demand)
            if block is not None:
                block.files = plan
            self._device.commit(key, layout, block, device_model)
        except BaseException:
            self._device.abort(key, block, device_model)
            raise

    def _fill(
        self,
        spec: ModelSpec,
        store: ObjectStore,
        block: HostBlock | None,
        device_model: DeviceModel | None,
        layouts: dict[str, Layout],
        offsets: list[int],
        plan: BlockLayout,
        hops: HopTimer,
        demand: bool,
    ) -> None:
        """Stream every file into the block (or, on the CPU device to L0, the L0 buffer itself), each
        part of the weights copied on to the device as it completes when both are there."""
        buffer = block.buffer if block is not None else device_model.padded if device_model else None
        assert buffer is not None  # one of them is reserved, and an L0 buffer is host memory here
        copier = DeviceCopier(device_model.segments()) if block is not None and device_model else None
        landed = None
        if copier is not None:

            def landed(start: int, end: int) -> None:
                # Not gated on the device link, as for a single file: short copies spread over a
                # download bounded by the network.
                copier.copy(buffer[start:end], start)

        small_file = None
        if block is not None:
            files = block.buffer.numpy()

            def small_file(path: str, data: bytes) -> None:
                where = plan.file(path)
                assert where is not None
                files[where.offset : where.offset + where.length] = memoryview(data)

        hop = "L3->L0" if device_model is not None else "L3->L1"
        with hops.hop(hop), self._gate.transfer(self._is_demand(spec.key, demand)) as transfer:
            try:
                stream_checkpoint(
                    store,
                    spec,
                    layouts,
                    offsets,
                    dest=host_view(buffer),
                    small_file=small_file,
                    pool=self._pool,
                    part_bytes=self._s3.s3_part_bytes,
                    window=2 * self._s3.s3_concurrency,
                    transfer=transfer,
                    landed=landed,
                )
            finally:
                if copier is not None:
                    copier.finish()
