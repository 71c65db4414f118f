"""Structured logging on the standard library: ``key=value`` text for people, JSON lines for machines.

Call sites pass context as ``extra={...}``; every extra key ends up in the record's output. Secrets are
never passed to a logger in the first place (tokens, credentials).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

__all__ = ["configure_logging", "get_logger"]

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        context = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if context:
            line = f"{line}  {context}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not when the handler was made: a
    stream swapped in for a while (a test runner's capture, typer's CliRunner) and closed afterwards
    must not break every later log line, such as those of background threads."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Install one stderr handler on the root logger (idempotent)."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_prewarm", False)]:
        root.removeHandler(old)
    handler._prewarm = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    # MLflow installs its own INFO handler when first imported, reading this variable then.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    for noisy in ("kafka", "botocore", "urllib3", "s3transfer", "alembic", "mlflow", "httpx"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
