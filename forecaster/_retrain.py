"""``retrain``: what the scheduler's daily cron job (and ``prewarm forecast train``) calls.

It reads ``history_days`` of per-minute history (from the demand store, or frames handed in), backtests
a fresh selection on the last ``holdout_days`` to score it, fits the bundle that will serve on the whole
history, and logs both to MLflow, where ``champion`` moves only if the new backtest is better. Time comes
in as ``now``; nothing here reads the clock for the data window.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from forecaster._backtest import BacktestReport
from forecaster._bundle import ForecasterBundle
from forecaster._chunked import HistorySeries, SeriesSource, StoreSeries, fit_chunked
from forecaster._engine import Engine, open_engine
from forecaster._history import History
from forecaster._select import SelectionConfig
from forecaster._tracking import RegisterDecision, log_retrain, tracking_client
from prewarm import ForecastError, Settings, get_logger

__all__ = ["RetrainResult", "retrain", "selection_config", "tracking_uri_of"]

log = get_logger(__name__)


class DemandReader(Protocol):
    """The part of ``ingest.DemandStore`` the forecaster reads."""

    def bulk(self, models: Any, start: float, end: float, step: int = 60) -> pd.DataFrame: ...

    def models_seen(self) -> list[str]: ...


@dataclass(frozen=True)
class RetrainResult:
    bundle: ForecasterBundle
    report: BacktestReport | None
    decision: RegisterDecision | None
    seconds: float
    timings: dict[str, float]
    engine: dict[str, Any] = field(default_factory=dict)
    """Where the fits ran: ``kind`` (in-process, local, remote), ``workers``, ``chunks``,
    ``chunk_models`` and ``workers_peak_rss_bytes`` (the sum over the worker processes)."""

    @property
    def run_id(self) -> str | None:
        return self.decision.run_id if self.decision else None


def selection_config(settings: Settings) -> SelectionConfig:
    f = settings.forecast
    return SelectionConfig(
        lead=f.lead_minutes,
        window=f.window_minutes,
        folds=f.selection_folds,
        fold_days=f.selection_fold_days,
    )


def tracking_uri_of(settings: Settings) -> str:
    """``mlflow_tracking_uri`` if set, else a file store under ``data_dir`` (the embedded default)."""
    uri = settings.forecast.mlflow_tracking_uri
    if uri:
        return uri
    return (Path(settings.core.data_dir).resolve() / "mlruns").as_uri()


def retrain(
    settings: Settings,
    source: DemandReader | pd.DataFrame | History | SeriesSource,
    now: float,
    *,
    track: bool = True,
    tracking_uri: str | None = None,
    config: SelectionConfig | None = None,
    engine: Engine | None = None,
) -> RetrainResult:
    """Retrain on the ``history_days`` before ``now``; log, register and maybe promote (``track``).

    ``config`` overrides the selection built from ``settings`` (tests and benchmarks restrict families).
    The fits run chunk by chunk (``forecast.retrain_chunk_models``) on ``engine``, else on the engine the
    settings name (``forecast.engine_address``, else ``forecast.retrain_workers`` local processes, else this
    one); the result is the same on any of them.
    """
    began = time.perf_counter()
    f = settings.forecast
    start = (int(now) // 60 - f.history_days * 1440) * 60
    end = int(now) // 60 * 60
    series = _series_of(source, start, end, settings)
    if not series.rows:
        raise ForecastError("no models with demand history to train on")
    config = config or selection_config(settings)
    timings: dict[str, float] = {"read_seconds": round(time.perf_counter() - began, 3)}
    holdout = int(f.holdout_days * 86400)
    backtested = series.minutes * 60 > holdout + 2 * 86400
    if not backtested:
        log.warning("history too short for a holdout backtest; the run is logged without a score")
    opened = (
        contextlib.nullcontext(engine)
        if engine is not None
        else open_engine(f.retrain_workers, f.engine_address)
    )
    with opened as used:
        fitted = fit_chunked(
            series,
            config,
            used,
            chunk_models=f.retrain_chunk_models,
            holdout_s=holdout if backtested else None,
            lead=f.lead_minutes,
            window=f.window_minutes,
            bucket_s=f.bucket_s,
            horizon_s=f.horizon_s,
        )
        engine_info = used.describe() | {
            "chunks": fitted.chunks,
            "chunk_models": f.retrain_chunk_models,
            "workers_peak_rss_bytes": used.workers_peak_rss_bytes(),
        }
    timings.update(fitted.seconds)
    bundle, report = fitted.bundle, fitted.report
    history_start, history_end = series.start, series.start + 60 * series.minutes
    mark = time.perf_counter()
    if report is not None:
        bundle.summary = {k: v for k, v in report.aggregate.items() if k != "by_pattern"}
    decision = None
    if track:
        from forecaster._plots import backtest_plots

        with tempfile.TemporaryDirectory() as tmp:
            plots = backtest_plots(report, Path(tmp)) if report is not None else []
            decision = log_retrain(
                tracking_client(tracking_uri or tracking_uri_of(settings)),
                bundle,
                report,
                experiment=f.mlflow_experiment,
                registered_model=f.registered_model,
                params={
                    "models": series.rows,
                    "history_start": history_start,
                    "trained_until": history_end,
                    "history_days": f.history_days,
                    "holdout_days": f.holdout_days,
                    "lead_minutes": f.lead_minutes,
                    "window_minutes": f.window_minutes,
                    "bucket_s": f.bucket_s,
                    "horizon_s": f.horizon_s,
                    "selection_folds": config.folds,
                    "families": ",".join(config.families),
                },
                now=now,
                plots=plots,
            )
    timings["tracking_seconds"] = round(time.perf_counter() - mark, 3)
    seconds = time.perf_counter() - began
    log.info(
        "forecaster retrained",
        extra={
            "models": series.rows,
            "seconds": round(seconds, 1),
            "engine": engine_info["kind"],
            "workers": engine_info["workers"],
            "brier_skill": None if report is None else round(report.aggregate["brier_skill"], 4),
            "promoted": None if decision is None else decision.promoted,
        },
    )
    return RetrainResult(bundle, report, decision, seconds, timings, engine_info)


def _series_of(
    source: DemandReader | pd.DataFrame | History | SeriesSource, start: int, end: int, settings: Settings
) -> SeriesSource:
    """The series of ``[start, end)`` as a chunkable source: the store's read chunk by chunk, a
    history in memory cut to the window."""
    if isinstance(source, pd.DataFrame):
        source = History.from_frame(source)
    if isinstance(source, History):
        history = source
        if history.minutes:
            history, _ = history.split(end)
            history = history.split(start)[1] if history.start < start else history
        return HistorySeries(history)
    if isinstance(source, SeriesSource):
        return source
    # Workers in other processes open the store themselves: at the URL of the store handed in (a
    # DemandStore's engine knows it), else the configured one.
    engine = getattr(source, "engine", None)
    url = engine.url.render_as_string(hide_password=False) if engine is not None else settings.database_url
    return StoreSeries(source, source.models_seen(), (start, end), url=url)
