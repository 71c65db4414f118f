"""``prewarm forecast``: Train, inspect and backtest the per-model demand forecasters.

Also registers ``prewarm bench forecast``: quality (Brier skill at lead 5 per pattern family, against a
constant-rate and a time-of-week baseline) and speed (retrain, 2-hour predict) on synthetic demand.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import typer

from prewarm import InvalidInput, Settings, abridged, iso_utc
from prewarm_cli._common import (
    TRACE_FORMAT_HELP,
    TRACE_HELP,
    app_group,
    bench_app,
    check_png,
    output_path,
    parse_time,
    progress,
    settings_of,
    trace_format,
    write_json,
)

app = app_group("Train, inspect and backtest the per-model demand forecasters.")

_JSON = typer.Option(
    None, "--json", callback=output_path, help="Write the result as JSON to this file ('-' = stdout)."
)


@app.command("train")
def train(
    ctx: typer.Context,
    now: str | None = typer.Option(
        None, "--now", help="Train on the history before this time (default: now)."
    ),
    track: bool = typer.Option(
        True, "--track/--no-track", help="Log the run to MLflow and maybe promote it."
    ),
    out: Path | None = typer.Option(None, "--out", help="Also save the fitted bundle to this directory."),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        help="Fitting processes on this machine (default: forecast.retrain_workers; 1 = this one).",
    ),
    address: str | None = typer.Option(
        None,
        "--scheduler-address",
        help="Fit on a running Dask cluster, by its scheduler's address (default: forecast.engine_address).",
    ),
    json_out: Path | None = _JSON,
) -> None:
    """Retrain every model from the demand store; log to MLflow; move 'champion' only if it is better."""
    from forecaster import retrain
    from ingest import DemandStore

    settings = _with_engine(settings_of(ctx), workers, address)
    at = parse_time(now, "--now") if now else time.time()
    store = DemandStore(settings.database_url)
    try:
        result = retrain(settings, store, at, track=track)
    finally:
        store.close()
    if out is not None:
        result.bundle.save(out)
    payload: dict[str, Any] = {
        "models": len(result.bundle.models),
        "trained_until": iso_utc(result.bundle.trained_until),
        "seconds": round(result.seconds, 2),
        "timings": result.timings,
        "engine": result.engine,
        "families_chosen": result.bundle.family_counts(),
        "aggregate": None if result.report is None else _without(result.report.aggregate, "by_pattern"),
        "decision": None if result.decision is None else vars(result.decision),
    }
    write_json(payload, json_out)


@app.command("show")
def show(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="Model id."),
    source: str | None = typer.Option(
        None, "--from", help="Bundle directory or MLflow URI (default: models:/<registered_model>@champion)."
    ),
    now: str | None = typer.Option(None, "--now", help="Forecast origin (default: now)."),
    horizon_s: int | None = typer.Option(None, "--horizon-s", help="Horizon in seconds (default: setting)."),
    png: Path | None = typer.Option(
        None, "--png", callback=output_path, help="Write a forecast-vs-actual plot here."
    ),
    actual: bool = typer.Option(
        True, "--actual/--no-actual", help="Read actual counts from the demand store."
    ),
    json_out: Path | None = _JSON,
) -> None:
    """Forecast vs actual for one model: a table per bucket (and a PNG with --png)."""
    import numpy as np

    from forecaster import load_forecaster, tracking_uri_of
    from prewarm import UnknownModel

    check_png(png)
    settings = settings_of(ctx)
    f = settings.forecast
    uri = source or f"models:/{f.registered_model}@champion"
    bundle = load_forecaster(uri, tracking_uri=tracking_uri_of(settings))
    if model not in bundle.models:
        raise UnknownModel(model)
    at = parse_time(now, "--now") if now else time.time()
    horizon = horizon_s or bundle.horizon_s
    fc = bundle.predict(at, horizon)[model]
    counts = None
    if actual:
        counts = _actual_counts(settings.database_url, model, fc.start, fc.end, fc.bucket_s)
    rows = [
        {
            "bucket_start": iso_utc(fc.start + i * fc.bucket_s),
            "expected": round(float(fc.expected[i]), 4),
            "p_any": round(float(fc.p_any[i]), 4),
            "actual": None if counts is None else int(counts[i]),
        }
        for i in range(len(fc.expected))
    ]
    if png is not None:
        from forecaster import forecast_plot

        forecast_plot(fc, model, None if counts is None else np.asarray(counts), png)
    choice = bundle.choice(model)
    header = {
        "model": model,
        "family": choice.family,
        "scale": choice.scale,
        "reason": choice.reason,
        "trained_until": iso_utc(bundle.trained_until),
    }
    if json_out is not None:
        write_json({**header, "buckets": rows}, json_out)
        return
    typer.echo(" ".join(f"{k}={v}" for k, v in header.items()))
    typer.echo(f"{'bucket_start':<22}{'expected':>10}{'p_any':>8}{'actual':>8}")
    for row in rows:
        shown = "" if row["actual"] is None else str(row["actual"])
        typer.echo(f"{row['bucket_start']:<22}{row['expected']:>10.3f}{row['p_any']:>8.3f}{shown:>8}")


def _actual_counts(url: str, model: str, start: float, end: float, bucket_s: int) -> list[int] | None:
    """Actual counts per bucket from the demand store, or None when there is no store to read."""
    from ingest import DemandStore
    from prewarm import StorageError

    try:
        store = DemandStore(url, create=False)
    except StorageError:
        return None
    try:
        series = store.series(model, start, end, step=bucket_s)
    except StorageError:
        return None
    finally:
        store.close()
    return [int(v) for v in series.to_numpy()]


@app.command("backtest")
def backtest_cmd(
    ctx: typer.Context,
    trace: list[Path] = typer.Option(..., "--trace", help=TRACE_HELP),
    fmt: str = typer.Option("requests", "--format", help=TRACE_FORMAT_HELP),
    train_until: str = typer.Option(..., "--train-until", help="Epoch seconds or ISO-8601: end of training."),
    lead_minutes: int | None = typer.Option(None, "--lead-minutes", help="Lead (default: setting, 5)."),
    window_minutes: int | None = typer.Option(
        None, "--window-minutes", help="Window (default: setting, 10)."
    ),
    start: str | None = typer.Option(None, "--start", help="Azure formats: the time the trace starts."),
    plots: Path | None = typer.Option(None, "--plots", help="Write reliability and forecast PNGs here."),
    json_out: Path | None = _JSON,
) -> None:
    """Backtest straight from a trace file (no store): train before --train-until, score after it."""
    from forecaster import History, backtest, selection_config
    from ingest import azure2019_minute_counts, read_trace

    trace_fmt = trace_format(fmt)
    settings = settings_of(ctx)
    lead = settings.forecast.lead_minutes if lead_minutes is None else lead_minutes
    window = settings.forecast.window_minutes if window_minutes is None else window_minutes
    origin = parse_time(start, "--start") if start else None
    if trace_fmt == "azure2019":
        # Each file is per-minute counts of a whole day: use them as they are, trailing zeros included.
        history = History.from_frame(azure2019_minute_counts(trace, start=origin))
    else:
        events = read_trace(trace, trace_fmt, start=origin)
        if events.empty:
            raise InvalidInput(f"{abridged([str(t) for t in trace])}: no events", reason="empty")
        history = History.from_events(events)
    config = selection_config(settings)
    report = backtest(
        history, parse_time(train_until, "--train-until"), lead=lead, window=window, config=config
    )
    if plots is not None:
        from forecaster import backtest_plots

        backtest_plots(report, plots)
    write_json(report.to_json(), json_out or Path("-"))


@bench_app.command("forecast")
def bench_forecast(
    ctx: typer.Context,
    models: int = typer.Option(1000, "--models", help="Synthetic models."),
    days: float = typer.Option(14.0, "--days", help="Days of per-minute history."),
    train_days: float = typer.Option(11.0, "--train-days", help="Backtest: train on the first N days."),
    seed: int = typer.Option(0, "--seed", help="Generator seed."),
    retrain_run: bool = typer.Option(
        True,
        "--retrain/--no-retrain",
        help="Also time a full retrain logged to a temporary MLflow file store.",
    ),
    workers: str | None = typer.Option(
        None,
        "--workers",
        help="Comma-separated worker counts (1,2): time one retrain per count instead, same models, and "
        "report peak memory and whether every run's selections and MLflow run are identical.",
    ),
    json_out: Path | None = _JSON,
) -> None:
    """Quality per pattern family (Brier skill vs constant rate and time-of-week); retrain/predict speed.

    With --workers: retrain scaling (runs: workers, seconds, peak_rss_bytes; identical)."""
    from forecaster import run_forecast_bench, run_retrain_scaling

    if workers is not None:
        counts = _worker_counts(workers)
        scaling = run_retrain_scaling(
            settings_of(ctx), models=models, days=days, workers=counts, seed=seed, progress=progress
        )
        write_json(scaling, json_out or Path("-"))
        return
    result = run_forecast_bench(
        settings_of(ctx),
        models=models,
        days=days,
        train_days=train_days,
        seed=seed,
        with_retrain=retrain_run,
        progress=progress,
    )
    write_json(result.to_json(), json_out or Path("-"))


def _without(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key and not (isinstance(v, float) and math.isnan(v))}


def _worker_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter("expected worker counts like 1,2", param_hint="--workers") from None
    if not counts or any(c < 1 for c in counts):
        raise typer.BadParameter("expected worker counts of at least 1, like 1,2", param_hint="--workers")
    return counts


def _with_engine(settings: Settings, workers: int | None, address: str | None) -> Settings:
    """The settings with the CLI's engine options in place of the configured ones."""
    update: dict[str, Any] = {}
    if workers is not None:
        update["retrain_workers"] = workers
    if address is not None:
        update["engine_address"] = address
    if not update:
        return settings
    forecast = settings.forecast.model_validate(settings.forecast.model_dump() | update)
    return settings.model_copy(update={"forecast": forecast})
