"""Where a retrain's per-chunk fits run: in this process, on a local Dask pool, or on a Dask cluster.

Fitting one chunk of models needs nothing of another chunk, so the engine only has to run one function
over many small, picklable work items and hand the results back in order. Dask ``distributed`` does
that with the least machinery: ``LocalCluster`` is a process pool on this machine (the default when
``workers > 1``), and the same ``Client`` API reaches a running cluster by its scheduler's address
(``forecast.engine_address``), so a laptop and a hundred-node retrain run the same code. It is a pure
Python dependency (no daemon to install, unlike Ray's raylet and object store, whose shared-memory
store would also count against the memory this retrain is meant to keep small).

At most ``2 × workers`` items are in flight at once, so a source whose items carry their series (an
in-memory history) is never copied to the workers all at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from prewarm import ConfigError, get_logger

__all__ = ["Engine", "cpu_seconds", "import_fitting", "open_engine", "peak_rss_bytes"]

log = get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_QUIET_POOL: dict[str, Any] = {
    # Dask sets MALLOC_TRIM_THRESHOLD_=65536 in its workers to hand freed memory back to the OS. Set,
    # it also pins glibc's mmap threshold at 128 kB, so every per-series array (14 days of minutes is
    # 161 kB) is a fresh mmap whose pages fault in again: 20x the page faults and +60 % CPU per
    # chunk, measured, against the same chunk in process. Unset, a worker allocates as this process does.
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    # The workers' statistical profiler samples every 10 ms: CPU a fit on shared cores cannot spare.
    "distributed.worker.profile.enabled": False,
    # Housekeeping a long batch does not need this often: event-loop health ticks (20 ms), system
    # and GIL monitors (500 ms, 1 ms) and the memory monitor (100 ms) in the two workers and the
    # driver (its scheduler and nannies) took 9 % of a core while idle; at these intervals, 1.5 %.
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.tick.cycle": "5s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.admin.system-monitor.disk": False,
    "distributed.admin.system-monitor.gil.enabled": False,
    "distributed.worker.memory.monitor-interval": "1s",
}


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports kilobytes)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def cpu_seconds() -> float:
    """User and system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return float(usage.ru_utime + usage.ru_stime)


def process_usage() -> tuple[tuple[str, int], tuple[int, float]]:
    """This process as ``(host, pid)`` and its ``(peak RSS, CPU s)`` so far (run on each worker)."""
    return (socket.gethostname(), os.getpid()), (peak_rss_bytes(), cpu_seconds())


@dataclass
class Engine:
    """Runs ``map`` in this process (``client`` None) or through a Dask ``Client``."""

    kind: str
    """``in-process``, ``local`` (a ``LocalCluster`` this engine started) or ``remote``."""
    workers: int
    client: Any = None

    @property
    def portable(self) -> bool:
        """Whether work items leave this process (they must then be picklable and self-contained)."""
        return self.client is not None

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(item) for item in items]``, in order, on the engine's workers (see ``imap``)."""
        return list(self.imap(fn, items))

    def imap(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``fn(item)`` for each of ``items``, yielded in order, each as soon as it and those before it
        are done. ``items`` is consumed lazily: an item is made when there is room for it (in process:
        one at a time). At most ``2 × workers`` items run at once, and the next is submitted as soon as
        any finishes, so a slow item holds back only its own place; at most ``4 × workers`` are
        submitted and not yet yielded (results waiting behind a slower one included), so a caller that
        folds each result as it comes never holds more than that many, however many items."""
        if self.client is None:
            for item in items:
                yield fn(item)
            return
        as_completed: Any = _distributed().as_completed
        running_at_most = max(2, 2 * self.workers)
        ahead_at_most = 2 * running_at_most
        pending = iter(enumerate(items))
        index_of: dict[str, int] = {}
        ready: dict[int, R] = {}
        flow = as_completed()
        submitted = yielded = 0

        def fill() -> None:
            nonlocal submitted
            while len(index_of) < running_at_most and submitted - yielded < ahead_at_most:
                nxt = next(pending, None)
                if nxt is None:
                    return
                future = self.client.submit(fn, nxt[1], pure=False)
                index_of[future.key] = nxt[0]
                flow.add(future)
                submitted += 1

        fill()
        for future in flow:
            ready[index_of.pop(future.key)] = future.result()
            future.release()
            fill()  # before the caller takes its results: the workers go on meanwhile
            while yielded in ready:
                result = ready.pop(yielded)
                yielded += 1
                yield result
            fill()

    def workers_peak_rss_bytes(self) -> int:
        """The sum of the peak RSS of every process of the engine but this one: the workers and, where
        they are processes of their own (a cluster's ``dask worker``), their nannies. 0 in process,
        where the driver's own peak says it all."""
        return sum(int(usage[0]) for usage in self._processes().values())

    def workers_cpu_seconds(self) -> float:
        """CPU time the engine's processes but this one (see ``workers_peak_rss_bytes``) have used so far."""
        return float(sum(usage[1] for usage in self._processes().values()))

    def _processes(self) -> dict[tuple[str, int], tuple[int, float]]:
        """``(peak RSS, CPU s)`` per process of the engine but this one, by ``(host, pid)``.

        A ``LocalCluster``'s nannies are objects in this process, not processes: counted per nanny
        they would add the driver's peak and CPU once per worker."""
        if self.client is None:
            return {}
        found = dict(self.client.run(process_usage).values())
        with contextlib.suppress(ValueError, KeyError, AttributeError):  # workers started without a nanny
            found.update(self.client.run(process_usage, nanny=True).values())
        here, _ = process_usage()
        found.pop(here, None)
        return found

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "workers": self.workers}


@contextlib.contextmanager
def open_engine(workers: int = 1, address: str | None = None) -> Iterator[Engine]:
    """An engine for one retrain: a cluster's client when ``address`` is set, else a local pool of
    ``workers`` processes (one thread each: the fits are NumPy-bound and hold the GIL between calls),
    else, for one worker, this process (no pool to start: the default, and the single-process fit)."""
    if address is None and workers <= 1:
        yield Engine("in-process", 1)
        return
    dist = _distributed()
    Client, LocalCluster = dist.Client, dist.LocalCluster
    if address is not None:
        try:
            client: Any = Client(address, timeout="30s")
        except OSError as exc:
            raise ConfigError(
                f"cannot reach the Dask scheduler at {address}: {exc}",
                setting="PREWARM_ENGINE_ADDRESS",
            ) from exc
        try:
            count = len(client.scheduler_info().get("workers", {}))
            log.info("retrain engine", extra={"address": address, "workers": count})
            yield Engine("remote", max(count, 1), client)
        finally:
            client.close()
        return
    import dask.config

    dask_config: Any = dask.config
    with dask_config.set(_QUIET_POOL):
        cluster: Any = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.WARNING,
        )
    try:
        client = Client(cluster)
        try:
            # Each worker imports the fitting code once now, not inside its first chunk's time.
            client.run(import_fitting)
            log.info("retrain engine", extra={"workers": workers, "kind": "local"})
            yield Engine("local", workers, client)
        finally:
            client.close()
    finally:
        cluster.close()


def _distributed() -> Any:
    """The ``distributed`` module (untyped), imported only where a pool or a cluster is used."""
    try:
        import distributed
    except ImportError as exc:  # pragma: no cover - a control-plane install has it
        raise ConfigError("retraining on more than one worker needs dask distributed") from exc
    module: Any = distributed
    return module


def import_fitting() -> None:
    """Import what fitting a chunk imports, including what the fits import lazily.

    Lazily imported, they would be paid for inside each worker's first chunk: the statsmodels
    families, scipy.stats and, to read a chunk, ingest (the store and the synthetic generator, with
    its Kafka and SQL clients). Where bytecode is not cached (``PYTHONDONTWRITEBYTECODE``) that is
    ~12 s of CPU per process compiling sources, paid once by one process and once per worker.

    Safe to call again: each module is bound to a local name and only that name is let go (``del
    package.module`` would take the submodule off its package, and a second call would fail there)."""
    import statsmodels.tsa.holtwinters as holtwinters
    import statsmodels.tsa.seasonal as seasonal
    import threadpoolctl  # type: ignore[import-untyped]

    import forecaster._chunked as chunked
    import ingest

    del chunked, holtwinters, ingest, seasonal, threadpoolctl
