"""``prewarm sim``: replay a trace through the real planner and the baseline policies, side by side."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import typer

from prewarm_cli._common import app_group, bench_app, settings_of, write_json

if TYPE_CHECKING:
    from sim import Progress, SimMetrics

app = app_group("Trace-driven cluster simulation: the real planner against baseline policies.")


@contextlib.contextmanager
def progress_bar(enabled: bool) -> Iterator[Progress | None]:
    """A rich progress bar per policy on a terminal; None (no output) when not ``enabled``, in CI, or when
    standard error is not a terminal."""
    if not enabled or os.environ.get("CI") or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress as Bars

    with Bars(transient=True) as bars:
        tasks: dict[str, Any] = {}

        def report(label: str, fraction: float) -> None:
            if label not in tasks:
                tasks[label] = bars.add_task(label, total=1.0)
            bars.update(tasks[label], completed=min(max(fraction, 0.0), 1.0))

        yield report


@app.command()
def run(
    ctx: typer.Context,
    trace: Path = typer.Option(..., exists=True, dir_okay=False, help="Trace CSV (timestamp,model)."),
    fmt: str = typer.Option("requests", "--format", help="requests or azure2019."),
    train_days: float = typer.Option(7.0, help="Days at the start of the trace the forecaster learns from."),
    sim_hours: float = typer.Option(24.0, help="Hours after the training part to simulate."),
    cluster_file: Path | None = typer.Option(
        None, "--cluster", help="Cluster YAML (default: 2 nodes; not needed with --unlimited)."
    ),
    catalog_file: Path | None = typer.Option(None, "--catalog", help="Catalog (default: virtual sizes)."),
    hints_file: Path | None = typer.Option(
        None, "--hints", exists=True, dir_okay=False, help="Hints CSV (timestamp,model,ttl_s)."
    ),
    unlimited: bool = typer.Option(
        False, "--unlimited", help="One tier without limit and instant loads (the serverless comparison)."
    ),
    policies: list[str] | None = typer.Option(
        None,
        "--policy",
        help="NAME[:KNOB], repeatable: reactive, keepalive:TTL, histogram[:MIN], oracle, prewarm[:PRICE] "
        "(default: all five).",
    ),
    out: Path | None = typer.Option(None, "--json", help="Write the results as JSON here ('-': stdout)."),
) -> None:
    """Fit forecasters on the first days of TRACE, then simulate the next hours under each policy."""
    from ingest import read_trace
    from models import Catalog
    from scheduler import Cluster
    from sim import DEFAULT_POLICIES, available, compare, read_hints

    settings = settings_of(ctx)
    # read_trace validates the format: an unknown one is InvalidInput, exit status 2.
    events = read_trace(trace, cast("Literal['requests', 'azure2019']", fmt))
    catalog = Catalog.load(catalog_file) if catalog_file else None
    cluster = Cluster.load(cluster_file) if cluster_file else None
    hints = read_hints(hints_file) if hints_file else ()
    labels = list(policies) if policies else available(DEFAULT_POLICIES)
    to_stdout = out is not None and str(out) == "-"
    with progress_bar(not to_stdout) as progress:
        results = compare(
            events,
            settings,
            train_days=train_days,
            sim_hours=sim_hours,
            catalog=catalog,
            cluster=cluster,
            labels=labels,
            hints=hints,
            unlimited=unlimited,
            progress=progress,
        )
    if not to_stdout:
        models = events["model"].nunique()
        typer.echo(f"{models} models, {len(events)} requests in the trace")
        typer.echo(render_table(results))
    if out is not None:
        write_json({label: r.to_json() for label, r in results.items()}, out)


def render_table(results: Mapping[str, SimMetrics]) -> str:
    """One row per policy. Waits of a run whose cluster could not keep up are shown as 'unstable'."""
    header = (
        f"{'policy':<16} {'requests':>8} {'cold':>6} {'cold %':>6} {'p75 model':>9} {'>1 s':>6} "
        f"{'>5 s':>6} {'p95 s':>9} {'idle GB·min L0/L1':>19} {'prefetch':>8} {'mispred':>7} "
        f"{'moved TB':>8}"
    )
    lines = [header]
    for label, r in results.items():
        idle = r.idle_gb_minutes
        idle_text = f"{idle.get('L0', 0.0):,.0f}" + (f"/{idle['L1']:,.0f}" if "L1" in idle else "")
        waits = (
            f"{r.share_wait_over_1s:>6.1%} {r.share_wait_over_5s:>6.1%} {r.wait_p95_s:>9.1f}"
            if r.stable
            else f"{'unstable: offered load ' + format(r.offered_load, '.2f'):>23}"
        )
        lines.append(
            f"{label:<16} {r.requests:>8} {r.cold_starts:>6} {r.cold_start_rate:>6.1%} "
            f"{r.p75_model_cold_start_rate:>9.3f} {waits} {idle_text:>19} {r.prefetches:>8} "
            f"{r.mispredictions:>7} {r.bytes_moved / 1e12:>8.2f}"
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
    reports = run_policies(
        trace.events,
        catalog,
        cluster,
        ["reactive", "prewarm"],
        start=start,
        end=end,
        forecasts=bundle.predict,
        planner=PlannerConfig.from_settings(settings.scheduler),
    )
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
        "stable": reactive.stable and prewarm.stable,
        "reports": {name: r.to_json() for name, r in reports.items()},
    }
    write_json(result, out)
