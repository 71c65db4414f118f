"""``prewarm sim``: replay a trace through the real planner and through the baseline, side by side."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import typer

from prewarm_cli._common import app_group, bench_app, settings_of, write_json

if TYPE_CHECKING:
    from sim import SimReport

app = app_group("Trace-driven cluster simulation: the real planner against the reactive baseline.")


@app.command()
def run(
    ctx: typer.Context,
    trace: Path = typer.Option(..., exists=True, dir_okay=False, help="Trace CSV (timestamp,model)."),
    fmt: str = typer.Option("requests", "--format", help="requests or azure2019."),
    train_days: float = typer.Option(7.0, help="Days at the start of the trace the forecaster learns from."),
    sim_hours: float = typer.Option(24.0, help="Hours after the training part to simulate."),
    cluster_file: Path | None = typer.Option(None, "--cluster", help="Cluster YAML (default: 2 nodes)."),
    catalog_file: Path | None = typer.Option(None, "--catalog", help="Catalog (default: virtual sizes)."),
    out: Path | None = typer.Option(None, "--json", help="Write the reports as JSON here."),
) -> None:
    """Fit forecasters on the first days of TRACE, then simulate the next hours under each policy."""
    from ingest import read_trace
    from models import Catalog
    from scheduler import Cluster
    from sim import compare

    settings = settings_of(ctx)
    # read_trace validates the format: an unknown one is InvalidInput, exit status 2.
    events = read_trace(trace, cast("Literal['requests', 'azure2019']", fmt))
    models = sorted(events["model"].astype(str).unique())
    catalog = Catalog.load(catalog_file) if catalog_file else None
    cluster = Cluster.load(cluster_file) if cluster_file else None
    reports = compare(
        events, settings, train_days=train_days, sim_hours=sim_hours, catalog=catalog, cluster=cluster
    )
    typer.echo(f"{len(models)} models, {len(events)} requests in the trace")
    typer.echo(render_table(reports))
    if out is not None:
        write_json({name: r.to_json() for name, r in reports.items()}, out)


def render_table(reports: Mapping[str, SimReport]) -> str:
    """One row per policy: requests, cold starts, waits, where requests were served from."""
    lines = [
        f"{'policy':<10} {'requests':>8} {'cold':>6} {'wait s':>9} {'p95 s':>7} {'p99 s':>7} "
        f"{'from L0':>8} {'prefetch':>8} {'mispred':>7} {'queued':>6}"
    ]
    for name, r in reports.items():
        lines.append(
            f"{name:<10} {r.requests:>8} {r.cold_starts:>6} {r.wait_total_s:>9.0f} {r.wait_p95_s:>7.1f} "
            f"{r.wait_p99_s:>7.1f} {r.served_from['L0'] / max(r.requests, 1):>8.1%} {r.prefetches:>8} "
            f"{r.mispredictions:>7} {r.queued_loads:>6}"
        )
    return "\n".join(lines)


@bench_app.command("sim")
def bench_sim(
    ctx: typer.Context,
    models: int = typer.Option(14, "--models", min=1, help="Synthetic models (7 pattern families)."),
    days: int = typer.Option(
        8, "--days", min=2, help="Days of traffic: all but the last train the forecaster."
    ),
    nodes: int = typer.Option(2, "--nodes", min=1, help="GPU nodes of 2 x 80 GB, 400 GB host, 2 TB NVMe."),
    hours: float = typer.Option(24.0, "--hours", min=0.1, help="Hours of the last day to simulate."),
    from_hour: float = typer.Option(0.0, "--from-hour", min=0.0, help="Start of the simulated part."),
    seed: int = typer.Option(7, "--seed", help="Generator seed (7: the demo's traffic)."),
    out: Path | None = typer.Option(None, "--json", help="Write the result as JSON here (default stdout)."),
) -> None:
    """Prewarm against the reactive baseline on synthetic traffic: total and p99 wait, prefetch accuracy."""
    import time

    from forecaster import History, fit_bundle
    from ingest import generate
    from scheduler import PlannerConfig
    from sim import default_cluster, run_policies, virtual_catalog

    settings = settings_of(ctx)
    began = time.perf_counter()
    trace = generate(models, days, seed=seed)  # from a Monday 00:00 UTC, as the demo
    history = History.from_events(trace.events, start=trace.start)
    cut = trace.start + (days - 1) * 86400
    train, _ = history.split(cut)
    f = settings.forecast
    bundle = fit_bundle(train, bucket_s=f.bucket_s, horizon_s=f.horizon_s)
    fit_s = time.perf_counter() - began
    catalog, cluster = virtual_catalog(trace.models), default_cluster(nodes)
    start = cut + from_hour * 3600
    end = start + hours * 3600
    config = PlannerConfig.from_settings(settings.scheduler)
    reports = run_policies(trace.events, catalog, cluster, config, bundle.predict, start=start, end=end)
    typer.echo(render_table(reports), err=True)
    reactive, prewarm = reports["reactive"], reports["prewarm"]
    result: dict[str, Any] = {
        "setup": {
            "models": models,
            "days": days,
            "nodes": nodes,
            "hours": hours,
            "from_hour": from_hour,
            "seed": seed,
            "fit_seconds": round(fit_s, 1),
            "seconds": round(time.perf_counter() - began, 1),
        },
        "reactive_wait_s": round(reactive.wait_total_s, 1),
        "prewarm_wait_s": round(prewarm.wait_total_s, 1),
        "wait_ratio": round(prewarm.wait_total_s / reactive.wait_total_s, 3)
        if reactive.wait_total_s
        else None,
        "reactive_p99_s": round(reactive.wait_p99_s, 2),
        "prewarm_p99_s": round(prewarm.wait_p99_s, 2),
        "prefetches": prewarm.prefetches,
        "mispredictions": prewarm.mispredictions,
        "misprediction_rate": round(prewarm.mispredictions / prewarm.prefetches, 3)
        if prewarm.prefetches
        else 0.0,
        # Bytes the executors' LRU had to displace because an order asked a tier for room the plan had
        # not made: 0 is the contract. Loads on request may displace; only orders count.
        "over_commit_bytes": prewarm.over_commit_bytes,
        "reports": {name: r.to_json() for name, r in reports.items()},
    }
    write_json(result, out)
