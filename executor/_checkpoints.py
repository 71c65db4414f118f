"""Checkpoints between the tiers: L3 → L2 as one verified directory, and their weights as one layout.

- ``fetch_checkpoint``: every file of a catalog entry from L3 into an L2 directory. Sizes and shard
  headers are checked on L3 before anything is reserved; each file then streams through ``fetch_l3``
  into the directory being written and is checked against its sha256; the index's ``weight_map`` is
  checked against the shards' own headers; only then is the directory renamed into place.
- ``stream_checkpoint``: the same files and checks past L2, for a load that L2 cannot take (a full or
  failing disk): the shards straight into one buffer (an L1 block, the L0 buffer), the small files to
  the caller.
- ``l2_layout``: where a model's tensors sit in one flat buffer (an L1 block, an L0 buffer). A single
  file is its own layout; a checkpoint's shards are laid one after the other, each whole (header
  included) at an ``ALIGN``-ed offset, and one ``Layout`` names every tensor at its offset in the buffer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from executor import _metrics
from executor._l2 import L2Cache, L2Object
from executor._pipeline import fetch_l3, probe_l3, read_header_l2, stream_l3
from executor._priority import Transfer
from executor._safetensors import Layout, TensorEntry, header_length, parse_header
from executor._stores import ObjectStore
from executor._tier import round_up
from models import INDEX_FILE, ModelSpec, index_problems
from prewarm import IntegrityError, InvalidWeights, StorageError

__all__ = [
    "combined_layout",
    "fetch_checkpoint",
    "l2_layout",
    "probe_checkpoint",
    "stream_checkpoint",
    "weight_map_problems",
]


def weight_map_problems(index: bytes, layouts: Mapping[str, Layout]) -> list[str]:
    """Does the index's ``weight_map`` say where each tensor really is? (shard path → its layout)"""
    try:
        weight_map = json.loads(index).get("weight_map", {})
    except (ValueError, AttributeError):
        return [f"{INDEX_FILE}: not a JSON object"]
    problems = []
    for path, layout in sorted(layouts.items()):
        names = {entry.name for entry in layout.tensors}
        claimed = {name for name, shard in weight_map.items() if shard == path}
        if names != claimed:
            extra, absent = sorted(names - claimed), sorted(claimed - names)
            detail = "; ".join(
                part
                for part in (
                    f"holds {', '.join(extra[:3])} that weight_map puts elsewhere" if extra else "",
                    f"lacks {', '.join(absent[:3])} that weight_map puts there" if absent else "",
                )
                if part
            )
            problems.append(f"{INDEX_FILE}: {path} {detail}")
    return problems


def combined_layout(layouts: list[Layout]) -> tuple[Layout, list[int]]:
    """One layout over shards placed at ``ALIGN``-ed offsets; the offsets. Tensor names must be unique."""
    entries: list[TensorEntry] = []
    offsets: list[int] = []
    seen: set[str] = set()
    cursor = 0
    for layout in layouts:
        cursor = round_up(cursor)  # aligned: O_DIRECT reads land in place, every dtype view is aligned
        offsets.append(cursor)
        for e in layout.tensors:
            if e.name in seen:
                raise InvalidWeights(f"{e.name}: in more than one shard", reason="bad_header")
            seen.add(e.name)
            entries.append(TensorEntry(e.name, e.dtype, e.shape, cursor + e.start, cursor + e.end))
        cursor += layout.file_bytes
    metadata = layouts[0].metadata if len(layouts) == 1 else {}
    return Layout(0, cursor, tuple(entries), metadata), offsets


def l2_layout(obj: L2Object) -> tuple[Layout, list[tuple[int, L2Object]]]:
    """The buffer layout of an L2 object and the files that fill it: (offset in the buffer, file)."""
    if not obj.members:
        return read_header_l2(obj), [(0, obj)]
    weights = obj.weight_members()
    layout, offsets = combined_layout([read_header_l2(member) for member in weights])
    return layout, list(zip(offsets, weights, strict=True))


def probe_checkpoint(store: ObjectStore, spec: ModelSpec) -> dict[str, Layout]:
    """The validated layout of every shard of ``spec`` on L3, by path, once every file there has the
    size the catalog says: what is checked before a byte is reserved."""
    layouts: dict[str, Layout] = {}
    for f in sorted(spec.files, key=lambda f: f.path):
        uri = spec.file_uri(f.path)
        # Shard headers are validated before a byte is reserved; the other files are only sized.
        if f.path.endswith(".safetensors"):
            layouts[f.path] = probe_l3(store, uri)
            size = layouts[f.path].file_bytes
        else:
            size = store.size(uri)
        if size != f.size_bytes:
            raise IntegrityError(
                f"{spec.id} {spec.version}: {uri} has {size} bytes, the catalog says {f.size_bytes}; "
                "nothing cached"
            )
    return layouts


def fetch_checkpoint(
    store: ObjectStore,
    spec: ModelSpec,
    l2: L2Cache,
    *,
    pool: ThreadPoolExecutor,
    part_bytes: int,
    window: int,
    transfer: Transfer,
    weigh: bool = False,
) -> L2Object:
    """Download every file of ``spec`` into one L2 directory, verified; nothing is visible until all is.
    ``weigh``: it must win its place in a full L2 (``L2Cache.begin``)."""
    assert spec.sha256 is not None
    files = sorted(spec.files, key=lambda f: f.path)
    probe_checkpoint(store, spec)  # sizes and shard headers, before a byte is reserved
    cw = l2.begin_checkpoint(
        spec.sha256,
        [(f.path, f.size_bytes, f.sha256 or "") for f in files],
        model=spec.id,
        version=spec.version,
        weigh=weigh,
    )
    try:
        for f in files:
            tw = cw.begin_file(f.path)
            fetch_l3(
                store,
                spec.file_uri(f.path),
                cw,
                tw,
                dest=None,
                pool=pool,
                part_bytes=part_bytes,
                window=window,
                transfer=transfer,
            )
        problems = _index_problems(*_read_back(cw.directory, spec), spec)
        if problems:
            raise InvalidWeights(f"{spec.id} {spec.version}: " + "; ".join(problems), reason="bad_index")
    except BaseException:
        l2.abandon_checkpoint(cw)
        raise
    return l2.publish_checkpoint(cw)


def stream_checkpoint(
    store: ObjectStore,
    spec: ModelSpec,
    layouts: Mapping[str, Layout],
    offsets: Sequence[int],
    *,
    dest: tuple[memoryview, int],
    small_file: Callable[[str, bytes], None] | None,
    pool: ThreadPoolExecutor,
    part_bytes: int,
    window: int,
    transfer: Transfer,
    landed: Callable[[int, int], None] | None = None,
) -> None:
    """``fetch_checkpoint`` past L2, for a load L2 cannot take: each shard (in load order) from L3 into
    ``dest`` at its offset, checked against its sha256 (``landed(start, end)`` in ``dest``'s terms as
    its parts complete); each small file read whole, checked, and given to ``small_file`` (None: only
    the index is read, to check it); the index checked against the shards as on the way into L2."""
    weights = spec.weight_files()
    view, address = dest
    for f, offset in zip(weights, offsets, strict=True):

        def shard_landed(start: int, end: int, offset: int = offset) -> None:
            if landed is not None:
                landed(offset + start, offset + end)

        stream_l3(
            store,
            spec.file_uri(f.path),
            f.size_bytes,
            f.sha256 or "",
            dest=(view[offset:], address + offset),
            pool=pool,
            part_bytes=part_bytes,
            window=window,
            transfer=transfer,
            landed=shard_landed,
            what=f"{spec.id} {spec.version}: {f.path}",
        )
    index = None
    for f in sorted(spec.files, key=lambda f: f.path):
        if f.path in layouts or (small_file is None and f.path != INDEX_FILE):
            continue
        transfer.checkpoint()
        data = store.read_range(spec.file_uri(f.path), 0, f.size_bytes)
        if hashlib.sha256(data).hexdigest() != f.sha256:
            _metrics.INTEGRITY_FAILURES.labels("L3").inc()
            raise IntegrityError(
                f"{spec.id} {spec.version}: {f.path} downloaded with a sha256 other than the catalog's; "
                "nothing kept"
            )
        if f.path == INDEX_FILE:
            index = data
        if small_file is not None:
            small_file(f.path, data)
    # The headers as they landed (verified bytes): the tensor views are cut from the probed ones.
    landed_layouts = {}
    for f, offset in zip(weights, offsets, strict=True):
        n = header_length(bytes(view[offset : offset + 8]), f.size_bytes)
        landed_layouts[f.path] = parse_header(bytes(view[offset + 8 : offset + 8 + n]), f.size_bytes)
        if landed_layouts[f.path] != layouts[f.path]:
            raise IntegrityError(f"{spec.id} {spec.version}: {f.path} changed on L3 during the download")
    problems = _index_problems(index, landed_layouts, spec)
    if problems:
        raise InvalidWeights(f"{spec.id} {spec.version}: " + "; ".join(problems), reason="bad_index")


def _read_back(root: Path, spec: ModelSpec) -> tuple[bytes | None, dict[str, Layout]]:
    """The index and the shards' headers of a checkpoint directory just written (verified files)."""
    if not any(f.path == INDEX_FILE for f in spec.files):
        return None, {}
    try:
        index = (root / INDEX_FILE).read_bytes()
        layouts = {}
        for f in spec.weight_files():
            with open(root / f.path, "rb") as shard:
                n = header_length(shard.read(8), f.size_bytes)
                layouts[f.path] = parse_header(shard.read(n), f.size_bytes)
    except OSError as exc:
        raise StorageError(f"L2: cannot read back {root}: {exc.strerror}") from exc
    return index, layouts


def _index_problems(index: bytes | None, layouts: Mapping[str, Layout], spec: ModelSpec) -> list[str]:
    """The verified files agree with each other: the index names exactly the shards and their tensors."""
    if index is None:
        return []
    return index_problems(index, spec.files) or weight_map_problems(index, layouts)
