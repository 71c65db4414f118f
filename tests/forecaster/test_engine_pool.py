"""A local pool's workers fit as this process does: same allocator, one BLAS thread, imports paid at start."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator

import pytest

from forecaster import Engine, open_engine
from forecaster._engine import import_fitting, peak_rss_bytes

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


def test_importing_the_fitting_code_again_leaves_every_submodule_on_its_package() -> None:
    # The bench's driver imports it before its clock as each pool worker does at start; a second call in
    # one process once failed, the first having taken ``_chunked`` off the ``forecaster`` package.
    import statsmodels.tsa

    import forecaster

    import_fitting()
    import_fitting()
    assert forecaster._chunked is sys.modules["forecaster._chunked"]
    assert statsmodels.tsa.holtwinters is sys.modules["statsmodels.tsa.holtwinters"]


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


def _late_when_even(item: int) -> int:
    time.sleep(0.3 if item % 2 == 0 else 0.0)  # the odd items come back before the even ones before them
    return item


def _taken_at_each_yield(engine: Engine, count: int) -> tuple[list[int], list[int]]:
    taken: list[int] = []

    def items() -> Iterable[int]:
        for i in range(count):
            taken.append(i)
            yield i

    results, taken_then = [], []
    for result in engine.imap(_late_when_even, items()):
        results.append(result)
        taken_then.append(len(taken))
    return results, taken_then


def test_pool_imap_yields_in_order_and_holds_at_most_four_times_its_workers_ahead(pool: Engine) -> None:
    results, taken_then = _taken_at_each_yield(pool, 24)
    assert results == list(range(24))
    # Items submitted and not yet yielded, results waiting behind an earlier one included: what a
    # driver folding each result as it comes can be holding, whatever the number of items.
    ahead = [taken - yielded for yielded, taken in enumerate(taken_then, start=1)]
    assert max(ahead) <= 4 * pool.workers


def _slow_first(item: int) -> int:
    time.sleep(1.5 if item == 0 else 0.05)
    return item


def test_pool_imap_keeps_submitting_while_an_earlier_item_is_slow(pool: Engine) -> None:
    taken: list[int] = []

    def items() -> Iterable[int]:
        for i in range(12):
            taken.append(i)
            yield i

    results = pool.imap(_slow_first, items())
    assert next(results) == 0
    # While item 0 ran, the other worker went on with the items after it, as far as the bound allows
    # (submitting only once the oldest was taken, it stopped one past 2 x workers).
    assert len(taken) == 4 * pool.workers
    assert list(results) == list(range(1, 12))


def test_in_process_imap_makes_each_item_only_when_the_one_before_is_taken() -> None:
    results, taken_then = _taken_at_each_yield(Engine("in-process", 1), 5)
    assert results == list(range(5))
    assert taken_then == [1, 2, 3, 4, 5]
