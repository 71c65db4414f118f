"""A catalog entry read from the store that holds it: what ``prewarm models register`` writes.

A uri naming one object is a single-file entry (its size and streamed sha256). A directory or prefix is
a checkpoint: every object under it, less hidden files and weights in formats other than safetensors,
each hashed as a stream (several at once), then checked as the catalog would check it, and against its
own ``model.safetensors.index.json`` and shard headers, so that nothing is registered that the executor
would refuse later.
"""

from __future__ import annotations

import fnmatch
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from executor._checkpoints import weight_map_problems
from executor._pipeline import probe_l3
from executor._stores import ObjectStore, open_store
from models import (
    INDEX_FILE,
    CatalogProblem,
    FileSpec,
    ModelSpec,
    PriorityClass,
    index_problems,
    parse_entry,
)
from prewarm import InvalidWeights, ObjectStoreError, S3Settings

__all__ = ["DEFAULT_EXCLUDES", "Registration", "describe_entry"]

# Pickled or foreign weight formats that HF repositories often carry beside the safetensors shards
# (``pytorch_model.bin``, Llama's ``original/consolidated.00.pth``): never served, so never fetched.
DEFAULT_EXCLUDES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.h5", "*.msgpack", "*.gguf", "*.onnx")


@dataclass(frozen=True)
class Registration:
    spec: ModelSpec
    left_out: tuple[str, ...]  # files under the prefix that the entry does not list, and why


def describe_entry(
    uri: str,
    s3: S3Settings,
    *,
    model_id: str,
    version: str = "1",
    priority: PriorityClass | None = None,
    exclude: tuple[str, ...] = DEFAULT_EXCLUDES,
    store: ObjectStore | None = None,
) -> Registration:
    """The catalog entry for what ``uri`` names, with sizes and sha256 read from the store."""
    store = store or open_store(uri, s3)
    listing = [] if uri.endswith(".safetensors") else store.list_prefix(uri)
    extra = {"priority": priority.value} if priority is not None else {}
    if not listing:
        data = {"id": model_id, "version": version, "uri": uri, "size_bytes": store.size(uri), **extra}
        return Registration(parse_entry({**data, "sha256": store.sha256(uri)}, source=uri), ())
    root = uri.rstrip("/") + "/"
    kept, left_out = [], []
    for path, size in listing:
        if any(part.startswith(".") for part in path.split("/")):
            left_out.append(f"{path} (hidden)")
        elif any(fnmatch.fnmatch(path.rsplit("/", 1)[-1], pattern) for pattern in exclude):
            left_out.append(f"{path} (excluded: not safetensors weights)")
        else:
            kept.append((path, size))
    if not kept:
        raise ObjectStoreError(f"{uri}: nothing to register under it ({len(left_out)} files left out)")
    with ThreadPoolExecutor(max(1, min(len(kept), s3.s3_concurrency))) as pool:
        digests = list(pool.map(lambda item: store.sha256(root + item[0]), kept))
    files = [FileSpec(path=p, size_bytes=n, sha256=d) for (p, n), d in zip(kept, digests, strict=True)]
    weights = sum(f.size_bytes for f in files if f.path.endswith(".safetensors"))
    data = {
        "id": model_id,
        "version": version,
        "uri": root,
        "size_bytes": weights,
        "files": [f.model_dump() for f in files],
        **extra,
    }
    spec = parse_entry(data, source=uri)
    problems = _content_problems(store, spec)
    if problems:
        raise CatalogProblem(uri, problems)
    return Registration(spec, tuple(left_out))


def _content_problems(store: ObjectStore, spec: ModelSpec) -> list[str]:
    """What the files say about each other: shard headers valid, the index naming what they hold."""
    layouts = {}
    problems = []
    for f in spec.weight_files():
        try:
            layouts[f.path] = probe_l3(store, spec.file_uri(f.path))
        except InvalidWeights as exc:
            problems.append(f"{f.path}: not a valid safetensors file: {exc}")
    index = next((f for f in spec.files if f.path == INDEX_FILE), None)
    if index is None or problems:
        return problems
    raw = store.read_range(spec.file_uri(INDEX_FILE), 0, index.size_bytes) if index.size_bytes else b""
    return index_problems(raw, spec.files) or weight_map_problems(raw, layouts)
