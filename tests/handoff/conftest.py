"""Fixtures for the hand-off tests: an executor with its socket served, small real models."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "executor"))

from executor_testkit import executor_settings, make_model, s3_settings

from executor import Executor
from executor._handoff import HandoffServer
from models import Catalog

Served = tuple[Executor, Path]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """``serve(catalog, **settings)`` → an executor and the socket directory it serves."""
    made: list[tuple[Executor, HandoffServer]] = []

    def start(catalog: Catalog, *, socket_dir: Path | None = None, **overrides: Any) -> Served:
        executor = Executor(
            catalog,
            executor=executor_settings(**overrides),
            s3=s3_settings(),
            cache_dir=tmp_path / f"cache{len(made)}",
        )
        server = HandoffServer(executor, socket_dir or tmp_path / f"sock{len(made)}").start()
        made.append((executor, server))
        return executor, server.socket_dir

    yield start
    for executor, server in made:
        server.stop()
        executor.close()


@pytest.fixture
def two_models(tmp_path: Path) -> Catalog:
    return Catalog(make_model(tmp_path / "weights", f"m{i}", seed=i) for i in range(2))
