"""``prewarm produce``: Produce request-log events to Kafka: synthetic traffic or a trace replay."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from prewarm import get_logger
from prewarm_cli._common import (
    TRACE_FORMAT_HELP,
    app_group,
    catalog_path,
    parse_time,
    settings_of,
    trace_format,
)

app = app_group("Produce request-log events to Kafka: synthetic traffic or a trace replay.")
log = get_logger("prewarm.cli.produce")


def _replay(ctx: typer.Context, frame: Any, speedup: float, what: str) -> None:
    from ingest import RequestLogProducer, replay_frame

    settings = settings_of(ctx)
    with RequestLogProducer.from_settings(settings.kafka, settings.ingest) as producer:
        result = replay_frame(frame, producer, speedup=speedup)
    rate = result.events / result.seconds if result.seconds > 0 else 0.0
    typer.echo(
        f"{what}: {result.events} events to {settings.kafka.topic_requests} in {result.seconds:.1f}s "
        f"({rate:,.0f}/s)",
        err=True,
    )


@app.command("synthetic")
def synthetic(
    ctx: typer.Context,
    models: int = typer.Option(20, "--models", min=1, help="Number of synthetic models."),
    days: float = typer.Option(1.0, "--days", min=0.0007, help="Days of traffic to generate."),
    speedup: float = typer.Option(
        0.0, "--speedup", min=0, help="Event time runs this many times faster than wall time (0: no pacing)."
    ),
    seed: int = typer.Option(0, help="Random seed: the same seed gives the same events."),
    start: str | None = typer.Option(
        None, help="Event time of the first minute (epoch s or ISO-8601); default: so the traffic ends now."
    ),
    catalog_ids: bool = typer.Option(
        False, "--catalog-ids", help="Name the models after the catalog's ids, in order."
    ),
    catalog: Path | None = typer.Option(
        None, "--catalog", help="The catalog of --catalog-ids (default: PREWARM_CATALOG)."
    ),
) -> None:
    """Seasonal synthetic traffic: diurnal and weekly cycles, cron spikes, long tail, bursts, launches."""
    from ingest import generate

    ends_now = float(int((time.time() - days * 86_400) // 60) * 60)
    origin = ends_now if start is None else parse_time(start, "--start")
    trace = generate(models, days, seed=seed, start=origin)
    events = trace.events
    if catalog_ids:
        from models import Catalog

        names = dict(
            zip(trace.models, Catalog.load(catalog_path(None, settings_of(ctx))).ids(), strict=False)
        )
        # Models beyond the catalog's size keep their synthetic names (and are ignored by the planner).
        events = events.assign(model=events["model"].cat.rename_categories(lambda m: names.get(m, m)))
    _replay(ctx, events, speedup, f"synthetic ({models} models, {days:g} days)")


@app.command("trace")
def trace(
    ctx: typer.Context,
    path: Path = typer.Argument(..., exists=True, dir_okay=False, help="Trace CSV."),
    fmt: str = typer.Option("requests", "--format", help=TRACE_FORMAT_HELP),
    speedup: float = typer.Option(
        0.0, "--speedup", min=0, help="Event time runs this many times faster than wall time (0: no pacing)."
    ),
    start: str | None = typer.Option(
        None,
        help="Azure formats: the time the trace starts (default 2019-07-15T00:00Z); requests: shift the "
        "trace to it.",
    ),
) -> None:
    """Replay a trace file (the formats of the design) onto the request-log topic."""
    from ingest import read_trace

    origin = parse_time(start, "--start") if start is not None else None
    frame = read_trace(path, trace_format(fmt), start=origin)
    if fmt == "requests" and origin is not None and not frame.empty:  # shift the trace to --start
        frame = frame.assign(timestamp=frame["timestamp"] - float(frame["timestamp"].iloc[0]) + origin)
    _replay(ctx, frame, speedup, f"trace {path.name}")
