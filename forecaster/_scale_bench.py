"""``prewarm bench forecast --workers 1,2``: one retrain per worker count, same synthetic models.

Each run is a fresh process (so its peak memory is its own): it generates the series chunk by chunk
on the workers that fit them (``SyntheticSeries``), retrains with a throw-away MLflow file store, and
hands back its time, the peak RSS summed over itself and its worker processes (a local pool's nannies
are objects in this process, not processes), and a digest of what it produced: every model's
selection, parameters, calibration and idle profile, and the MLflow run's params and metrics (timings
left out). ``identical`` says whether every run's digest is the same.

The engine's start (a local pool's processes importing the fitting code, and this process importing
it and what the tracking imports, whatever the number of workers) is timed apart from the retrain: a
deployment that retrains daily keeps its cluster (or its process), and ``engine_start_seconds`` says
what a cold one adds. ``cpu_seconds`` is the CPU of the same processes during the retrain.

Every run's throw-away store stays until the last run is done: on a file system that will not reuse an
inode freed in the last minutes (ext4 without a journal, as on the 2-core VM the figures come from: the
kernel's ``recently_deleted`` check), a run creating its store within a minute or so of the run before
deleting its own paid ~0.5 ms a file in the kernel. When a store held four metric files a model (before
the per-model scores became one table) that was 5-6 s of the second run's tracking at 3,000 models.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from forecaster._chunked import SyntheticSeries
from forecaster._engine import cpu_seconds, import_fitting, open_engine, peak_rss_bytes
from forecaster._retrain import retrain
from prewarm import ForecastError, Settings, load_settings

__all__ = ["run_retrain_scaling"]

_TIMING_METRICS = {"agg.fit_seconds"}
_TIMING_SUMMARY = {"fit_seconds"}


def run_retrain_scaling(
    settings: Settings,
    *,
    models: int,
    days: float,
    workers: Sequence[int],
    seed: int = 0,
    timeout_s: float = 3600.0,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Retrain ``models`` synthetic series of ``days`` once per entry of ``workers``; the JSON layout
    ``runs: [{workers, seconds, peak_rss_bytes, ...}]``, ``identical``, the setup and the targets."""
    forecast = settings.forecast.model_dump(mode="json")
    runs: list[dict[str, Any]] = []
    # One directory for every run's store, removed once all are done (see the module's docstring).
    with tempfile.TemporaryDirectory(prefix="prewarm-retrain-scaling-") as stores:
        for index, count in enumerate(workers):
            progress(f"retraining {models} models x {days:g} days on {count} worker(s)")
            job = {
                "forecast": forecast,
                "models": models,
                "days": days,
                "seed": seed,
                "workers": count,
                "store": str(Path(stores) / f"run-{index}-workers-{count}"),
            }
            run = _in_child(job, timeout_s)
            progress(
                f"{count} worker(s): {run['seconds']:.1f}s, peak RSS {run['peak_rss_bytes'] / 2**30:.2f} GiB"
                f" (engine start {run['engine_start_seconds']:.1f}s)"
            )
            runs.append(run)
    digests = {r.pop("digest") for r in runs}
    by_workers = {r["workers"]: r for r in runs}
    speedup = (
        round(by_workers[1]["seconds"] / by_workers[2]["seconds"], 3)
        if 1 in by_workers and 2 in by_workers
        else None
    )
    load = os.getloadavg()
    return {
        "setup": {
            "models": models,
            "days": days,
            "seed": seed,
            "chunk_models": settings.forecast.retrain_chunk_models,
            "cpus": os.cpu_count(),
            "load_average_after": [round(v, 2) for v in load],
        },
        "runs": runs,
        "identical": len(digests) == 1,
        "speedup_2_over_1": speedup,
        "targets": {
            "two_workers_ge_1.7x": None if speedup is None else speedup >= 1.7,
            "peak_memory_under_2GB": all(r["peak_rss_bytes"] < 2_000_000_000 for r in runs),
            "identical": len(digests) == 1,
        },
    }


def _in_child(job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    # A process of its own per run: peak RSS is a high-water mark, and a run after another would
    # carry the first one's. Spawned, not forked, and not daemonic: a local pool starts processes.
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(job, send), daemon=False)
    child.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            raise ForecastError(f"retrain on {job['workers']} worker(s) did not finish in {timeout_s:g}s")
        result: dict[str, Any] = receive.recv()
    except EOFError as exc:
        raise ForecastError(
            f"retrain on {job['workers']} worker(s) died (exit code {child.exitcode})"
        ) from exc
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
    if "error" in result:
        raise ForecastError(f"retrain on {job['workers']} worker(s) failed: {result['error']}")
    return result


def _child_main(job: dict[str, Any], send: Any) -> None:
    try:
        send.send(_run(job))
    except Exception as exc:  # reported to the parent, which raises it as a ForecastError
        send.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        send.close()


def _import_tracking() -> None:
    """What a retrain's tracking imports on first use: matplotlib for the plots (through the plots' own
    ``_pyplot``, so the backend is theirs) and MLflow's client, model and registry modules. Where no
    bytecode is written (as here) each is compiled from source on import: 3-4 s each.

    Also MLflow's SQLAlchemy tracking store (~2 s here): a file registry reads each model version's
    logged model through MLflow's process-wide default client (its own TODO), which in MLflow 3 is a
    SQLite store, ``mlflow.db`` in the working directory; the retrain's own client never asks for it."""
    import mlflow.entities
    import mlflow.exceptions
    import mlflow.models
    import mlflow.pyfunc
    import mlflow.store.tracking.sqlalchemy_store
    import mlflow.tracking.context.registry

    from forecaster._plots import _pyplot

    _pyplot()
    del mlflow


def _run(job: dict[str, Any]) -> dict[str, Any]:
    base = load_settings()
    forecast = base.forecast.model_copy(
        update=job["forecast"] | {"retrain_workers": job["workers"], "engine_address": None}
    )
    settings = base.model_copy(update={"forecast": forecast})
    source = SyntheticSeries(job["models"], job["days"], seed=job["seed"])
    now = float(source.start + 60 * source.minutes)
    # The parent removes the store after the last run, not this run when it ends (module docstring).
    store = Path(job["store"])
    store.mkdir(parents=True)
    uri = (store / "mlruns").as_uri()
    began = time.perf_counter()
    with open_engine(job["workers"]) as engine:
        # What a chunk's fit imports is imported by the workers at their start and, here, by the
        # driver too: it assembles and checks the bundle with the same code. So is what the
        # tracking imports on first use. The scheduler process that retrains daily has all of it
        # loaded from its first retrain; both clocks leave it out, for every worker count.
        import_fitting()
        _import_tracking()
        started = time.perf_counter() - began
        cpu = cpu_seconds() + engine.workers_cpu_seconds()
        began = time.perf_counter()
        result = retrain(settings, source, now, tracking_uri=uri, engine=engine)
        seconds = time.perf_counter() - began
        cpu = cpu_seconds() + engine.workers_cpu_seconds() - cpu
        workers_rss = engine.workers_peak_rss_bytes()
    driver_rss = peak_rss_bytes()
    digest = _digest(result.bundle, uri, result.run_id, store)
    return {
        "workers": job["workers"],
        "seconds": round(seconds, 2),
        "peak_rss_bytes": driver_rss + workers_rss,
        "driver_peak_rss_bytes": driver_rss,
        "workers_peak_rss_bytes": workers_rss,
        "engine_start_seconds": round(started, 2),
        # On a shared machine wall time says as much about the neighbours as about the retrain.
        "cpu_seconds": round(cpu, 2),
        "chunks": result.engine.get("chunks"),
        "timings": result.timings,
        "families_chosen": result.bundle.family_counts(),
        "brier_skill": None if result.report is None else result.report.aggregate["brier_skill"],
        "digest": digest,
    }


def _digest(bundle: Any, uri: str, run_id: str | None, tmp: Path) -> str:
    """What must be the same whatever the engine: the saved bundle but its timings, and the run."""
    from forecaster._tracking import tracking_client

    saved = bundle.save(tmp / "digest")
    h = hashlib.sha256()
    for name in ("params.jsonl", "idle.json"):
        path = saved / name
        h.update(path.read_bytes() if path.exists() else b"-")
    header = json.loads((saved / "bundle.json").read_text())
    header["summary"] = {k: v for k, v in header.get("summary", {}).items() if k not in _TIMING_SUMMARY}
    h.update(json.dumps(header, sort_keys=True).encode())
    if run_id is not None:
        client = tracking_client(uri)
        run = client.get_run(run_id)
        metrics = {k: v for k, v in run.data.metrics.items() if k not in _TIMING_METRICS}
        h.update(json.dumps({"params": run.data.params, "metrics": metrics}, sort_keys=True).encode())
        h.update(Path(client.download_artifacts(run_id, "backtest/per_model.csv", str(tmp))).read_bytes())
    return h.hexdigest()
