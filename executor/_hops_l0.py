"""The hops between host and device memory, and making what a load filled visible.

``DeviceHops`` is the part of the ``Loader`` (``_hops``) that touches L0: L1 → L0 as chunked device
copies on the L1->L0 link (split between the GPUs a model spans), L0 → L1 when a model is demoted
from the device, and ``commit``/``abort`` of what a load reserved in either tier. A commit gives an L0
copy its tensor views, each on the shard (GPU) that holds it.
"""

from __future__ import annotations

from collections.abc import Callable

from executor._l0 import DeviceModel, L0Cache
from executor._l1 import HostBlock, L1Cache
from executor._pipeline import DeviceCopier
from executor._priority import LinkGate
from executor._result import HopTimer
from executor._safetensors import Layout
from executor._tier import ModelKey
from models import ModelSpec

__all__ = ["DeviceHops"]


class DeviceHops:
    """L1 ↔ L0 for one node. ``is_demand(key, demand)`` says whether a request waits on ``key`` now."""

    def __init__(
        self,
        l0: L0Cache,
        l1: L1Cache,
        gate: LinkGate,
        chunk_bytes: int,
        is_demand: Callable[[ModelKey, bool], Callable[[], bool]],
    ) -> None:
        self.l0, self.l1 = l0, l1
        self._gate = gate
        self._chunk_bytes = chunk_bytes
        self._is_demand = is_demand

    def l1_to_l0(
        self, spec: ModelSpec, block: HostBlock, hops: HopTimer, demand: bool, gpus: tuple[int, ...]
    ) -> None:
        key = spec.key
        layout = block.layout
        assert layout is not None
        device_model = self.l0.reserve(
            key, layout.file_bytes, prefetched=not demand, layout=layout, gpus=gpus
        )
        try:
            copier = DeviceCopier(device_model.segments())
            with hops.hop("L1->L0"), self._gate.transfer(self._is_demand(key, demand)) as transfer:
                copier.copy_all(block.buffer, layout.file_bytes, self._chunk_bytes, transfer)
            self.commit(key, layout, None, device_model)
        except BaseException:
            self.abort(key, None, device_model)
            raise

    def l0_to_l1(self, spec: ModelSpec, hops: HopTimer, demand: bool) -> bool:
        """Copy a model down from L0 into L1 when only L0 holds it; False when L0 does not."""
        key = spec.key
        device_model = self.l0.cache.pin(key)
        if device_model is None:
            return False
        try:
            assert device_model.layout is not None  # committed entries have one
            # A copy written down is the same bet as the copy it came from, not a new one: a model that
            # served requests from L0 and is demoted to make room must not be counted as mispredicted.
            prefetched = not demand and self.l0.cache.unused_prefetch(key)
            block = self.l1.reserve(key, device_model.nbytes, prefetched=prefetched)
            try:
                with hops.hop("L0->L1"):
                    device_model.copy_to(block.buffer)  # synchronous: the block is ready after
                self.commit(key, device_model.layout, block, None)
            except BaseException:
                self.abort(key, block, None)
                raise
        finally:
            self.l0.cache.unpin(key)
        return True

    def commit(
        self, key: ModelKey, layout: Layout, block: HostBlock | None, device_model: DeviceModel | None
    ) -> None:
        """Make what a load filled visible: its L1 block, its L0 buffer (with a view per tensor)."""
        if block is not None:
            block.layout = layout
            self.l1.cache.commit(key, block)
        if device_model is not None:
            device_model.layout = layout
            device_model.tensors = device_model.views(layout)
            self.l0.cache.commit(key, device_model)

    def abort(self, key: ModelKey, block: HostBlock | None, device_model: DeviceModel | None) -> None:
        """Give back what a failed load reserved; none of it was ever visible."""
        if device_model is not None:
            self.l0.cache.abort(key)
        if block is not None:
            self.l1.cache.abort(key)
