"""Fixtures for executor tests; the helpers live in executor_testkit."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from executor_testkit import ExecutorFactory, executor_settings, make_model, s3_settings

from executor import Executor, ObjectStore
from executor._pipeline import RingFactory
from models import Catalog
from prewarm import S3Settings


@pytest.fixture
def weights_dir(tmp_path: Path) -> Path:
    return tmp_path / "weights"


@pytest.fixture
def catalog(weights_dir: Path) -> Catalog:
    return Catalog(make_model(weights_dir, f"m{i}", seed=i) for i in range(3))


@pytest.fixture
def make_executor(tmp_path: Path) -> Iterator[ExecutorFactory]:
    made: list[Executor] = []

    def make(
        catalog: Catalog,
        *,
        cache_dir: Path | None = None,
        s3: S3Settings | None = None,
        clock: Callable[[], float] | None = None,
        direct_l0: bool | None = None,
        stores: Mapping[str, ObjectStore] | None = None,
        staging_ring: RingFactory | None = None,
        **overrides: Any,
    ) -> Executor:
        kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
        executor = Executor(
            catalog,
            executor=executor_settings(**overrides),
            s3=s3 or s3_settings(),
            cache_dir=cache_dir or tmp_path / "cache",
            direct_l0=direct_l0,
            stores=stores,
            staging_ring=staging_ring,
            **kwargs,
        )
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.close()
