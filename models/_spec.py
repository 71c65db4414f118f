"""A model as the catalog knows it."""

from __future__ import annotations

import enum
from typing import Annotated, Self
from urllib.parse import quote, unquote, urlparse

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from models._files import SHA256, EntryProblems, FileSpec, file_problems, is_weight_file, manifest_sha256
from prewarm import ModelId, known_schemes, parse_bytes

__all__ = ["ModelSpec", "PriorityClass"]


class PriorityClass(enum.StrEnum):
    """How much a second of waiting costs for this model, relative to ``standard``."""

    CRITICAL = "critical"
    STANDARD = "standard"
    BATCH = "batch"

    @property
    def weight(self) -> float:
        return {"critical": 4.0, "standard": 1.0, "batch": 0.25}[self.value]


class ModelSpec(BaseModel):
    """One model version: where its safetensors weights live, how big they are, and their digest.

    A single-file entry's ``uri`` is the safetensors file itself and ``files`` is empty. A checkpoint
    entry's ``uri`` is a directory or object-store prefix and ``files`` lists every file under it
    (shards, index, config, tokenizer) with size and sha256; its ``size_bytes`` is the sum of the
    safetensors files (what host and device memory hold), and its ``sha256`` the digest of that list
    (``manifest_sha256``), filled in when the catalog leaves it out.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: ModelId
    version: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")]
    uri: str
    size_bytes: Annotated[int, BeforeValidator(parse_bytes), Field(gt=0)]  # or as written: "16GB", "2GiB"
    sha256: str | None = None
    priority: PriorityClass = PriorityClass.STANDARD
    files: tuple[FileSpec, ...] = ()

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        # The spine's registry, read at validation time: a store registered after import counts.
        scheme, sep, rest = value.partition("://")
        schemes = known_schemes()
        if not sep or scheme not in schemes:
            raise ValueError(f"uri scheme must be one of {', '.join(s + '://' for s in schemes)}")
        if not rest or (rest.startswith("/") and scheme == "s3"):
            raise ValueError("uri has no bucket or path")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str | None) -> str | None:
        if value is not None and not SHA256.fullmatch(value):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return value

    @property
    def key(self) -> tuple[str, str, str | None]:
        """What a cached copy is keyed by, so that a stale version can never be served."""
        return (self.id, self.version, self.sha256)

    @model_validator(mode="after")
    def _checkpoint(self) -> Self:
        if not self.files:
            return self
        problems = file_problems(self.files, self.size_bytes)
        if not problems:
            fingerprint = manifest_sha256(self.files)
            if self.sha256 is None:
                # Frozen model: the digest is derived, not user input, so it is set once here.
                object.__setattr__(self, "sha256", fingerprint)
            elif self.sha256 != fingerprint:
                problems.append(
                    f"sha256: {self.sha256[:12]}... is not the digest of the listed files "
                    f"({fingerprint[:12]}...); leave it out to have it computed"
                )
        if problems:
            raise EntryProblems(problems)
        return self

    @property
    def is_checkpoint(self) -> bool:
        """A directory of files (Hugging Face layout) rather than one safetensors file."""
        return bool(self.files)

    def weight_files(self) -> tuple[FileSpec, ...]:
        """The safetensors files in load order (shards by name); a single-file entry's one file."""
        if not self.files:
            name = unquote(urlparse(self.uri).path).rstrip("/").rsplit("/", 1)[-1] or "model.safetensors"
            return (FileSpec(path=name, size_bytes=self.size_bytes, sha256=self.sha256),)
        return tuple(sorted((f for f in self.files if is_weight_file(f.path)), key=lambda f: f.path))

    def file_uri(self, path: str) -> str:
        """The uri of one file of a checkpoint (its path is relative to ``uri``)."""
        if not self.files:
            return self.uri
        return self.uri.rstrip("/") + "/" + quote(path)
