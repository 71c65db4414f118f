"""``prewarm scheduler``: The scheduler: planning loop, hint API and order publishing."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from prewarm_cli._common import app_group, bench_app, catalog_path, output_path, settings_of, write_json

app = app_group("The scheduler: planning loop, hint API and order publishing.")


@app.command("run")
def run(
    ctx: typer.Context,
    catalog: Path | None = typer.Option(None, help="Catalog YAML (default: PREWARM_CATALOG)."),
    cluster: Path | None = typer.Option(None, help="Cluster YAML (default: PREWARM_CLUSTER, else one node)."),
) -> None:
    """Plan, publish timed orders to Kafka and serve the hint API until interrupted.

    Several replicas may run on one PostgreSQL database (each with its own PREWARM_API_PORT): one is
    active and plans, the others serve hints and take over if it dies. GET /readyz says which.
    """
    import uvicorn

    from models import Catalog
    from scheduler import Cluster, Runtime, create_app

    settings = settings_of(ctx)
    if settings.core.log_level != "DEBUG":
        # APScheduler logs every job run at INFO: one line per published order drowns the log.
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    path = catalog_path(catalog, settings)
    # Without --cluster the runtime falls back to PREWARM_CLUSTER itself, then to one node.
    runtime = Runtime(
        settings, Catalog.load(path), Cluster.load(cluster) if cluster else None, catalog_path=path
    )
    runtime.start()
    try:
        app_ = create_app(
            runtime.core,
            settings.scheduler,
            ready=runtime.ready,
            accept_hint=runtime.accept_hint,
            active=lambda: runtime.active,
            status=runtime.status_sources(),
        )
        sched = settings.scheduler
        role = "active" if runtime.active else "standby"
        typer.echo(
            f"replica {runtime.replica} ({role}): hint API on http://{sched.api_host}:{sched.api_port}",
            err=True,
        )
        uvicorn.run(
            app_,
            host=sched.api_host,
            port=sched.api_port,
            log_level="warning",
            access_log=False,  # a request line can carry nothing secret, but keep the log for events
        )
    finally:
        runtime.stop()


@bench_app.command("hints")
def bench_hints(
    ctx: typer.Context,
    json_out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write the result as JSON here (- = stdout)."
    ),
    hints: int = typer.Option(200, min=1, help="Hints to post, one after another."),
) -> None:
    """Latency from POST /v1/hints to the order on the orders topic (target p99 < 100 ms)."""
    from scheduler import bench_hints as measure

    result = measure(settings_of(ctx), hints)
    write_json(result, json_out)
    if json_out is not None and str(json_out) != "-":
        typer.echo(f"hints={result['hints']} p50={result['p50_ms']}ms p99={result['p99_ms']}ms", err=True)


@bench_app.command("plan")
def bench_plan(
    json_out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write the result as JSON here (- = stdout)."
    ),
    models: str = typer.Option("10000", help="Models in the synthetic catalog; several, comma-separated."),
    nodes: int = typer.Option(100, min=1, help="GPU nodes."),
    gpus: int = typer.Option(8, min=1, help="GPUs per node (80 GB each)."),
    rounds: int = typer.Option(10, min=1, help="Full rounds to time."),
    hints: int = typer.Option(200, min=1, help="Single hints to time against the loaded plan."),
    baseline_hints: int = typer.Option(
        3, min=0, help="Hints timed through a core that plans each with a full round (the old way)."
    ),
) -> None:
    """Full planning rounds and hint -> orders at scale (targets: round p99 < 1 s, hint p99 < 20 ms).

    With several --models, each is measured in this run; the JSON's top level is the last one's, and
    ``runs`` lists them all.
    """
    from scheduler import bench_plan as measure

    try:
        sizes = [int(m) for m in models.split(",") if m.strip()]
    except ValueError:
        raise typer.BadParameter("--models takes whole numbers, comma-separated") from None
    if not sizes or min(sizes) < 1:
        raise typer.BadParameter("--models takes at least one positive number")
    runs = []
    for n in sizes:
        run = measure(n, nodes, gpus, rounds=rounds, hints=hints, baseline_hints=baseline_hints)
        runs.append(run)
        typer.echo(
            f"models={n} round p50={run['round_p50_s']}s p99={run['round_p99_s']}s "
            f"hint p50={run['hint_p50_s'] * 1000:.2f}ms p99={run['hint_p99_s'] * 1000:.2f}ms",
            err=True,
        )
    result = {**runs[-1], "runs": runs} if len(runs) > 1 else runs[0]
    write_json(result, json_out)
