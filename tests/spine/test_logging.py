"""Structured logging: what a log line looks like and where it goes."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from prewarm import configure_logging


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root_logger")
def test_logs_go_to_the_current_stderr_even_after_the_one_at_setup_was_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at_setup = io.StringIO()
    monkeypatch.setattr(sys, "stderr", at_setup)
    configure_logging("INFO", "json")
    at_setup.close()  # what a CLI runner does to its captured stream when the command returns
    later = io.StringIO()
    monkeypatch.setattr(sys, "stderr", later)

    logging.getLogger("prewarm.test").info("still heard", extra={"model": "m0"})

    line = json.loads(later.getvalue())
    assert (line["msg"], line["model"], line["level"]) == ("still heard", "m0", "info")
