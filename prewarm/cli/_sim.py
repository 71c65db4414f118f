"""``prewarm sim``: replay a trace through the real planner and through the baseline, side by side."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prewarm.cli._common import app_group, settings_of, write_json

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
    events = read_trace(trace, "azure2019" if fmt == "azure2019" else "requests")
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
