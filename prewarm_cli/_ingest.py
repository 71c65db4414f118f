"""``prewarm ingest``: Ingest gateway request logs from Kafka into per-model per-minute demand.

Also registers ``prewarm bench ingest``. The ``ingest`` package is imported inside each command, so
``prewarm --help`` stays fast.
"""

from __future__ import annotations

import csv
import signal
import sys
import threading
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import typer

from prewarm import InvalidInput, get_logger
from prewarm_cli._common import app_group, bench_app, output_path, parse_time, settings_of, write_json

app = app_group("Ingest gateway request logs from Kafka into per-model per-minute demand.")
log = get_logger("prewarm.cli.ingest")


@app.command("run")
def run(
    ctx: typer.Context,
    group: str | None = typer.Option(None, help="Consumer group (default: the consumer_group setting)."),
    topic: str | None = typer.Option(None, help="Request-log topic (default: the topic_requests setting)."),
    max_records: int | None = typer.Option(None, min=1, help="Stop once this many records are committed."),
    idle_exit: float | None = typer.Option(
        None, min=0, help="Stop after this many seconds without a record (one-shot catch-up)."
    ),
) -> None:
    """Consume the request log into the demand store until SIGTERM/SIGINT (then flush and commit)."""
    stop = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()  # the loop notices within one poll, then flushes and commits

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    from ingest import DemandStore, IngestConsumer

    settings = settings_of(ctx)
    metrics_port = settings.ingest.ingest_metrics_port
    if metrics_port is not None:
        from prometheus_client import start_http_server

        from prewarm import REGISTRY

        start_http_server(metrics_port, addr=settings.ingest.ingest_metrics_host, registry=REGISTRY)
    store = DemandStore(settings.database_url)
    try:
        consumer = IngestConsumer(store, settings.kafka, settings.ingest, topic=topic, group=group)
        log.info(
            "ingest consumer started",
            extra={"topic": consumer.topic, "group": consumer.group, "store": repr(store)},
        )
        summary = consumer.run(stop, max_records=max_records, idle_exit_s=idle_exit)
    finally:
        store.close()
    log.info(
        "ingest consumer stopped",
        extra={
            "records": summary.records,
            "events": summary.events,
            "late_counted": summary.late_counted,
            "too_late": summary.too_late,
            "dead_lettered": dict(summary.dead_lettered),
            "batches": summary.batches,
            "conflicts": summary.conflicts,
        },
    )


@app.command("export")
def export(
    ctx: typer.Context,
    since: str | None = typer.Option(None, help="Only minutes at or after this time (epoch s or ISO-8601)."),
    csv_out: Path = typer.Option(Path("-"), "--csv", help="Output CSV ('-': stdout)."),
) -> None:
    """Write ``model,minute,requests,cold_starts`` (minute as epoch seconds), ordered by minute."""
    from ingest import DemandStore

    start = parse_time(since, "--since") if since is not None else None
    store = DemandStore(settings_of(ctx).database_url)
    try:
        if str(csv_out) == "-":
            _write_rows(store.minutes(since=start), sys.stdout)
        else:
            csv_out.parent.mkdir(parents=True, exist_ok=True)
            with csv_out.open("w", newline="") as handle:
                _write_rows(store.minutes(since=start), handle)
    finally:
        store.close()


def _write_rows(rows: Any, handle: Any) -> None:
    writer = csv.writer(handle, lineterminator="\n")
    writer.writerow(["model", "minute", "requests", "cold_starts"])
    for model, minute, requests, cold_starts, _wait in rows:
        writer.writerow([model, minute, requests, cold_starts])


@app.command("rollup")
def rollup(
    ctx: typer.Context,
    retention_days: float | None = typer.Option(
        None, min=1, help="Keep minutes this long (default: the minute_retention_days setting)."
    ),
    at: str | None = typer.Option(None, help="Roll up as of this time (epoch s or ISO-8601; default now)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Roll minutes older than the retention window up to hourly rows (idempotent, one transaction);
    on PostgreSQL also make the day partitions ahead and drop the rolled-up ones."""
    import time

    from ingest import DemandStore

    settings = settings_of(ctx)
    now = parse_time(at, "--at") if at is not None else time.time()
    days = retention_days if retention_days is not None else settings.ingest.minute_retention_days
    with DemandStore(settings.database_url) as store:
        result = store.maintain(now, days * 86_400)
    if as_json:
        write_json(result.to_json(), None)
        return
    typer.echo(
        f"rolled up {result.minute_rows} minute rows before {result.cutoff} into {result.hour_rows} "
        f"hourly rows; partitions dropped {result.partitions_dropped}, created {result.partitions_created}"
    )


@app.command("migrate")
def migrate(ctx: typer.Context) -> None:
    """Bring an existing demand store to the current layout (hourly table; PostgreSQL: the minute
    table partitioned by day, rows moved in one transaction). Idempotent; stop consumers first."""
    from ingest import DemandStore

    with DemandStore(settings_of(ctx).database_url) as store:
        moved = store.migrate()
        layout = "partitioned by day" if store.partitioned else "one table"
    typer.echo(f"demand store migrated: minute table {layout}; {moved} minute rows moved")


@app.command("stats")
def stats(
    ctx: typer.Context,
    group: str | None = typer.Option(None, help="Consumer group (default: the consumer_group setting)."),
    topic: str | None = typer.Option(None, help="Request-log topic (default: the topic_requests setting)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Events counted, dead letters by reason, lag per partition, last event time per model."""
    from ingest import DemandStore, ingest_stats

    settings = settings_of(ctx)
    store = DemandStore(settings.database_url)
    try:
        report = ingest_stats(
            store,
            settings.kafka,
            group or settings.ingest.consumer_group,
            topic or settings.kafka.topic_requests,
        )
    finally:
        store.close()
    if as_json:
        write_json(report.to_json(), None)
        return
    typer.echo(f"group {report.group} on {report.topic}")
    typer.echo(
        f"  records {report.records}  events {report.events}"
        f"  (late {report.late_counted})  too late {report.too_late}"
    )
    for reason, n in report.dead_lettered.items():
        typer.echo(f"  dead-lettered {reason}: {n}")
    for part, value in report.lag.items():
        typer.echo(f"  partition {part}: lag {'unknown' if value is None else value}")
    if report.lag_error:
        typer.echo(f"  (lag unknown: {report.lag_error})")
    for model, ts in report.last_event.items():
        stamp = datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")
        typer.echo(f"  {model}: last event {stamp}")


@bench_app.command("ingest")
def bench_ingest(
    ctx: typer.Context,
    events: int = typer.Option(200_000, min=1, help="Events to produce and consume."),
    partitions: int = typer.Option(1, min=1, max=64, help="Partitions of the fresh topic."),
    models: int = typer.Option(50, min=1, help="Distinct model ids in the events."),
    compression: str = typer.Option("none", help="Producer compression: none, gzip, lz4 or zstd."),
    consumers: str | None = typer.Option(
        None,
        help="Comma-separated consumer-process counts (e.g. 1,2): measure the group's throughput "
        "per count instead of one consumer against a bare poll loop.",
    ),
    rounds: int = typer.Option(3, min=1, max=20, help="Interleaved (bare, ingest) pass pairs; best of each."),
    use_settings_store: bool = typer.Option(
        False, "--settings-store", help="Use the configured database (default: a fresh SQLite file)."
    ),
    json_out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write the result as JSON here ('-': stdout)."
    ),
) -> None:
    """Produce N events to a fresh topic; measure the consumer into the store against a bare poll loop
    (or, with --consumers, the group's events/s and CPU seconds per number of consumer processes)."""
    from ingest import BenchConfig, run_group_bench, run_ingest_bench

    if compression not in ("none", "gzip", "lz4", "zstd"):
        raise InvalidInput(
            f"compression must be none, gzip, lz4 or zstd, not {compression!r}", reason="option"
        )
    settings = settings_of(ctx)
    url = settings.database_url if use_settings_store else None
    if consumers is not None:
        try:
            counts = tuple(int(c) for c in consumers.split(",") if c.strip())
        except ValueError as exc:
            raise InvalidInput(
                f"--consumers must be counts like 1,2, not {consumers!r}", reason="option"
            ) from exc
        if not counts or min(counts) < 1:
            raise InvalidInput("--consumers needs counts of at least 1", reason="option")
        group = run_group_bench(
            settings.kafka,
            settings.ingest,
            events=events,
            partitions=partitions,
            consumers=counts,
            models=models,
            compression=compression,
            rounds=rounds,
            database_url=url,
        )
        if json_out is not None:
            write_json(group, json_out)
        for r in group["runs"]:
            typer.echo(
                f"ingest with {r['consumers']} consumer(s) on {partitions} partitions: "
                f"{r['events_per_s']:,.0f} events/s, {r['cpu_seconds']:.2f} CPU s "
                f"({r['events_per_cpu_s'] or 0:,.0f} events/CPU s), exact={r['exact']}",
                err=json_out is not None and str(json_out) == "-",
            )
        return
    config = BenchConfig(
        events=events,
        partitions=partitions,
        models=models,
        compression=compression,
        rounds=rounds,
        database_url=url,
    )
    result = run_ingest_bench(settings.kafka, settings.ingest, config)
    if json_out is not None:
        write_json(result, json_out)
    typer.echo(
        f"ingest: {result['events_per_s']:,.0f} events/s into the store, bare poll loop "
        f"{result['bare_consumer_events_per_s']:,.0f} events/s (ratio {result['ratio']:.2f})",
        err=json_out is not None and str(json_out) == "-",
    )


@bench_app.command("store")
def bench_store(
    ctx: typer.Context,
    models: int = typer.Option(10_000, min=1, help="Synthetic models (rows counted exactly for all)."),
    days: float = typer.Option(30.0, min=1, help="Simulated days of demand."),
    retention_days: float = typer.Option(7.0, min=1, help="Minute retention of the rolled-up store."),
    sample_models: int = typer.Option(50, min=1, help="Models written to a real store to measure bytes/row."),
    use_settings_store: bool = typer.Option(
        False,
        "--settings-store",
        help="Measure on the configured PostgreSQL (in a scratch schema, dropped after; default: SQLite).",
    ),
    json_out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write the result as JSON here ('-': stdout)."
    ),
) -> None:
    """Demand-store size after DAYS of MODELS at the synthetic suite's rates, with and without rollups."""
    from ingest import run_store_size_bench

    settings = settings_of(ctx)
    result = run_store_size_bench(
        models=models,
        days=days,
        retention_days=retention_days,
        sample_models=sample_models,
        database_url=settings.database_url if use_settings_store else None,
    )
    if json_out is not None:
        write_json(result, json_out)
    typer.echo(
        f"store after {days:g} days of {models} models ({result['store']}): "
        f"{result['bytes_without_rollups'] / 2**20:,.1f} MiB without rollups, "
        f"{result['bytes_with_rollups'] / 2**20:,.1f} MiB with {retention_days:g}-day minute retention",
        err=json_out is not None and str(json_out) == "-",
    )
