"""Model ids: validated once, here, so that every later use in a path or object key is safe."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, WithJsonSchema

__all__ = ["MAX_MODEL_ID_LENGTH", "ModelId", "validate_model_id"]

MAX_MODEL_ID_LENGTH = 128
# Segments separated by "/" (as in "org/name"); each segment starts with a letter or digit, so "." and
# ".." can never be a segment and no id starts with "/".
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(?:/[A-Za-z0-9][A-Za-z0-9_.\-]*)*")
# The same rule as JSON Schema, so that an API document built from ``ModelId`` says what is refused
# (an empty id was schema-valid and then refused). The lookahead is the "no '..'" check; JSON Schema
# patterns are ECMA-262, where it means the same.
_MODEL_ID_JSON_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_MODEL_ID_LENGTH,
    "pattern": rf"^(?!.*\.\.){_MODEL_ID.pattern}$",
}


def validate_model_id(value: str) -> str:
    """Return ``value`` if it is a safe model id, else raise ``ValueError`` saying why."""
    if not isinstance(value, str):
        raise ValueError("model id must be a string")
    if not value:
        raise ValueError("model id must not be empty")
    if len(value) > MAX_MODEL_ID_LENGTH:
        raise ValueError(f"model id longer than {MAX_MODEL_ID_LENGTH} characters")
    if ".." in value:
        raise ValueError(f"model id {value!r} contains '..'")
    if not _MODEL_ID.fullmatch(value):
        raise ValueError(
            f"model id {value!r} must be letters, digits, '.', '_', '-' in '/'-separated segments "
            "that start with a letter or digit"
        )
    return value


ModelId = Annotated[str, AfterValidator(validate_model_id), WithJsonSchema(_MODEL_ID_JSON_SCHEMA)]
