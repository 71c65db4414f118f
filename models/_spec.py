"""A model as the catalog knows it."""

from __future__ import annotations

import enum
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prewarm import ModelId, known_schemes

__all__ = ["ModelSpec", "PriorityClass"]

_SHA256 = re.compile(r"[0-9a-f]{64}")


class PriorityClass(enum.StrEnum):
    """How much a second of waiting costs for this model, relative to ``standard``."""

    CRITICAL = "critical"
    STANDARD = "standard"
    BATCH = "batch"

    @property
    def weight(self) -> float:
        return {"critical": 4.0, "standard": 1.0, "batch": 0.25}[self.value]


class ModelSpec(BaseModel):
    """One model version: where its safetensors weights live, how big they are, and their digest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: ModelId
    version: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")]
    uri: str
    size_bytes: Annotated[int, Field(gt=0)]
    sha256: str | None = None
    priority: PriorityClass = PriorityClass.STANDARD

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
        if value is not None and not _SHA256.fullmatch(value):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return value

    @property
    def key(self) -> tuple[str, str, str | None]:
        """What a cached copy is keyed by, so that a stale version can never be served."""
        return (self.id, self.version, self.sha256)
