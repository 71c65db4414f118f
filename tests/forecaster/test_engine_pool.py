"""A local pool's workers fit as this process does: same allocator, one BLAS thread, imports paid at start."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from forecaster import Engine, open_engine
from forecaster._engine import peak_rss_bytes

_LAZY = ("statsmodels.tsa.holtwinters", "statsmodels.tsa.seasonal", "ingest", "forecaster._chunked")


def _worker_conditions() -> dict[str, object]:
    from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

    return {
        "pid": os.getpid(),
        "malloc_trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "blas_threads": sorted({int(pool["num_threads"]) for pool in threadpool_info()}),
        "imported": [m for m in _LAZY if m in sys.modules],
    }


@pytest.fixture(scope="module")
def pool() -> Iterator[Engine]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)  # an inherited one would win over Dask's default
        with open_engine(2) as engine:
            yield engine


def test_pool_workers_keep_glibcs_own_mmap_threshold_and_one_blas_thread(pool: Engine) -> None:
    conditions = list(pool.client.run(_worker_conditions).values())
    assert len(conditions) == 2
    for worker in conditions:
        # Dask's MALLOC_TRIM_THRESHOLD_ pins the mmap threshold: each per-series array re-faults its pages.
        assert worker["malloc_trim"] is None
        assert worker["omp"] == "1"
        assert worker["blas_threads"] == [1]


def test_pool_workers_have_imported_what_a_chunk_imports_lazily_before_the_first_chunk(pool: Engine) -> None:
    for worker in pool.client.run(_worker_conditions).values():
        assert worker["imported"] == list(_LAZY)


def test_pool_memory_counts_each_worker_process_once_and_not_the_driver(pool: Engine) -> None:
    workers = pool.client.run(peak_rss_bytes)
    pids = {w["pid"] for w in pool.client.run(_worker_conditions).values()}
    assert len(pids) == 2
    assert os.getpid() not in pids
    counted = pool.workers_peak_rss_bytes()
    # The nannies live in this process: counting them would add this process's peak twice.
    assert counted == pytest.approx(sum(workers.values()), rel=0.05)
    assert counted < sum(workers.values()) + peak_rss_bytes()
    assert pool.workers_cpu_seconds() > 0
