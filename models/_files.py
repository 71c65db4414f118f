"""The files of a checkpoint entry: one ``FileSpec`` per file, and the rules a Hugging Face layout obeys.

A checkpoint is a directory (or an object-store prefix) in the Hugging Face layout: safetensors shards
``model-0000k-of-0000n.safetensors`` named by ``model.safetensors.index.json``'s ``weight_map``, plus
the small files an engine needs to start (``config.json``, ``generation_config.json``, tokenizer files).
The catalog lists every file with its size and sha256; the rules here are checked on that list alone
(``file_problems``), and the index's content, where someone has it in hand (``index_problems``).

An entry's own ``sha256`` is the digest of its manifest (``manifest_sha256``): one line per file,
``<sha256>  <path>`` in path order, as ``sha256sum`` prints them. It changes whenever any file does,
which is what makes ``(model, version, sha256)`` a fingerprint of the whole checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "INDEX_FILE",
    "EntryProblems",
    "FileSpec",
    "file_problems",
    "index_problems",
    "is_weight_file",
    "manifest_sha256",
]

INDEX_FILE = "model.safetensors.index.json"
SHA256 = re.compile(r"[0-9a-f]{64}")
# Weights in these formats unpickle arbitrary code or are not ours to read: safetensors only.
_REFUSED_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".h5", ".msgpack", ".gguf", ".onnx")
_MAX_PATH = 512


class EntryProblems(ValueError):
    """Several problems of one entry at once, so that the catalog reports each on its own line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class FileSpec(BaseModel):
    """One file of a checkpoint: its path relative to the entry's root, its size and its digest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size_bytes: Annotated[int, Field(ge=0)]
    sha256: str | None = None

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        # The path becomes a file name under the L2 directory: it must never reach outside it.
        if not value or len(value) > _MAX_PATH:
            raise ValueError(f"path must be 1 to {_MAX_PATH} characters")
        if value.startswith("/") or "\\" in value or "\0" in value:
            raise ValueError(f"path {value!r} must be relative, with '/' separators")
        parts = value.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"path {value!r} must not contain empty, '.' or '..' segments")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str | None) -> str | None:
        if value is not None and not SHA256.fullmatch(value):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return value


def is_weight_file(path: str) -> bool:
    return path.endswith(".safetensors")


def manifest_sha256(files: Iterable[FileSpec]) -> str:
    """The entry's fingerprint: sha256 over ``<sha256>  <path>\\n`` lines in path order."""
    digest = hashlib.sha256()
    for spec in sorted(files, key=lambda f: f.path):
        digest.update(f"{spec.sha256 or '-'}  {spec.path}\n".encode())
    return digest.hexdigest()


def file_problems(files: Sequence[FileSpec], size_bytes: int) -> list[str]:
    """What is wrong with a checkpoint's file list, one line per problem naming the file."""
    problems: list[str] = []
    first: dict[str, int] = {}
    for i, spec in enumerate(files):
        if spec.path in first:
            problems.append(
                f"files[{i}].path: {spec.path!r} is listed twice (first at files[{first[spec.path]}])"
            )
            continue
        first[spec.path] = i
        if spec.sha256 is None:
            problems.append(f"files[{i}].sha256: required for every file of a checkpoint ({spec.path})")
        if spec.path.endswith(_REFUSED_WEIGHTS):
            problems.append(
                f"files[{i}].path: {spec.path!r}: weights are accepted as safetensors only "
                "(leave it out of the entry)"
            )
    prefixes = {p.rsplit("/", 1)[0] + "/" for p in first if "/" in p}
    for path in first:
        if path + "/" in prefixes:
            problems.append(f"files: {path!r} is listed as a file and as a directory")
    weights = [f for f in files if is_weight_file(f.path)]
    if not weights:
        problems.append("files: no .safetensors file: a checkpoint needs its weights")
    elif len(weights) > 1 and INDEX_FILE not in first:
        problems.append(f"files: {len(weights)} safetensors shards but no {INDEX_FILE} naming them")
    total = sum(f.size_bytes for f in {f.path: f for f in weights}.values())
    if weights and total != size_bytes:
        problems.append(f"size_bytes: {size_bytes} is not the sum of the safetensors files ({total})")
    return problems


def index_problems(index: bytes, files: Sequence[FileSpec]) -> list[str]:
    """What is wrong with ``model.safetensors.index.json``'s content against the listed files."""
    try:
        data = json.loads(index)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [f"{INDEX_FILE}: not JSON: {exc}"]
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        return [f"{INDEX_FILE}: needs a 'weight_map' object mapping tensor names to shard files"]
    # weight_map names shards relative to the index's own directory (the entry's root here).
    named = set(weight_map.values())
    listed = {f.path for f in files if is_weight_file(f.path)}
    problems = []
    if missing := sorted(named - listed):
        problems.append(f"{INDEX_FILE}: weight_map names shards that are not listed: {', '.join(missing)}")
    if unnamed := sorted(listed - named):
        problems.append(
            f"{INDEX_FILE}: listed safetensors files that weight_map does not name: {', '.join(unnamed)} "
            "(leave them out of the entry, or fix the index)"
        )
    return problems
