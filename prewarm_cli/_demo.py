"""``prewarm demo``: the whole system on embedded defaults, in one process, with no services.

1. catalog     real safetensors weights synthesized on disk (``file://`` is L3)
2. executor    each model loaded L3 → L2 → L1 → L0 (the CPU stands in for the GPU), then served again
3. demand      a week of synthetic gateway traffic for a mixed fleet, counted per minute into SQLite
4. forecaster  per-model family selection by backtest, logged to a local MLflow file store
5. scheduler   a product-page hint turned into timed orders, applied by the executor
6. simulation  the next morning replayed through the real scheduler and every baseline policy, on
               the node and with unlimited memory, each policy's knob swept into a Pareto plot
7. engine      a separate engine process starting warm: its weights mapped from the executor's L1
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prewarm_cli._common import settings_of

if TYPE_CHECKING:
    from sim import SimMetrics

DEMO_START = 1_704_067_200.0  # Monday 2024-01-01 00:00 UTC: the synthetic week starts on a Monday


def _say(step: str, text: str) -> None:
    typer.echo(f"[{step}] {text}")


def demo(
    ctx: typer.Context,
    workdir: Path | None = typer.Option(None, help="Working directory (default: data_dir/demo)."),
    sizes: str = typer.Option("64MB,64MB,256MB", help="Sizes of the synthesized demo models."),
    fleet: int = typer.Option(14, min=7, help="Models in the simulated fleet (7 pattern families)."),
    days: int = typer.Option(8, min=3, help="Days of synthetic traffic; the last one is simulated."),
    sim_hours: float = typer.Option(6.0, min=0.5, help="Hours of the last day to simulate, from 06:00."),
) -> None:
    """Run prewarm end to end on embedded defaults: weights, executor, demand, forecasts, orders, sim."""
    from models import Catalog, synth_catalog
    from prewarm import format_bytes, parse_bytes

    settings = settings_of(ctx)
    root = (workdir or settings.core.data_dir / "demo").resolve()
    root.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()

    # 1. catalog -------------------------------------------------------------------------------------
    byte_sizes = [parse_bytes(s) for s in sizes.split(",")]
    catalog_path = settings.core.catalog or root / "weights" / "catalog.yaml"
    if settings.core.catalog or _made_with(catalog_path, f"sizes={byte_sizes}"):
        catalog = Catalog.load(catalog_path)
    else:
        catalog = synth_catalog(root / "weights", byte_sizes)
    _say("catalog", f"{len(catalog)} models in {catalog_path}")
    for spec in catalog:
        typer.echo(f"    {spec.id:<10} v{spec.version}  {format_bytes(spec.size_bytes):>10}  {spec.uri}")

    # 2. executor ------------------------------------------------------------------------------------
    from executor import Executor
    from prewarm import Tier

    cache = root / "cache"
    with contextlib.closing(Executor(catalog, settings, cache_dir=cache)) as node:
        _say("executor", f"device {node.device}, L2 cache {cache}")
        for spec in catalog:
            node.evict(spec.id, Tier.L2)  # start cold every run, so the demo shows the whole path
            cold = node.ensure(spec.id, Tier.L0)
            warm = node.ensure(spec.id, Tier.L0)
            hops = "  ".join(f"{hop} {s * 1000:.0f} ms" for hop, s in cold.seconds_per_hop.items())
            typer.echo(
                f"    {spec.id:<10} cold from {cold.served_from}: {hops}; "
                f"again: from {warm.served_from} in {warm.seconds * 1000:.1f} ms"
            )
        first = next(iter(catalog)).id
        with node.acquire(first) as tensors:
            name, tensor = next(iter(tensors.items()))
            typer.echo(
                f"    {first}: {len(tensors)} tensor views on one buffer, e.g. {name} "
                f"{tuple(tensor.shape)} {tensor.dtype}"
            )

        # 3. demand ----------------------------------------------------------------------------------
        from ingest import Cell, DemandStore, generate

        trace = generate(fleet, days, seed=7, start=DEMO_START)
        store_path = root / "demand.db"
        _made_with(store_path, f"fleet={fleet} days={days} start={DEMO_START}")  # else filled afresh below
        store_url = f"sqlite:///{store_path}"
        with DemandStore(store_url) as store:
            if not store.models_seen():
                frame = trace.minute_frame()
                cells = {
                    (model, int(minute)): Cell(requests=int(n))
                    for model in frame.columns
                    for minute, n in frame[model].items()
                    if n
                }
                store.add_counts(cells, {})
            total = sum(store.totals().values())
            _say("demand", f"{total} requests of {fleet} models over {days} days in {store_url}")
            families = ", ".join(sorted(set(trace.families.values())))
            typer.echo(f"    pattern families: {families}")

            # 4. forecaster --------------------------------------------------------------------------
            from forecaster import retrain

            train_end = DEMO_START + (days - 1) * 86400
            settings_local = settings.model_copy(
                update={
                    "forecast": settings.forecast.model_copy(
                        update={"mlflow_tracking_uri": (root / "mlruns").as_uri(), "history_days": days - 1}
                    )
                }
            )
            result = retrain(settings_local, store, train_end)
        bundle = result.bundle
        chosen = bundle.family_counts()
        _say(
            "forecaster", f"trained {len(bundle.models)} models on {days - 1} days; families chosen: {chosen}"
        )
        if result.report is not None:
            agg = result.report.aggregate
            typer.echo(
                f"    backtest: Brier {agg['brier']:.4f} vs constant-rate {agg['brier_baseline']:.4f} "
                f"(skill {agg['brier_skill']:.2f}); logged to {root / 'mlruns'}"
            )

        # 5. scheduler -------------------------------------------------------------------------------
        from prewarm import Hint
        from scheduler import Cluster, PlannerConfig, SchedulerCore

        l0 = node.state().tier(Tier.L0)
        cluster = Cluster.single_node(
            settings.executor.node_name,
            l0_bytes=l0.capacity_bytes if l0 is not None else 0,
            l1_bytes=settings.executor.l1_budget_bytes,
            l2_bytes=settings.executor.l2_budget_bytes,
        )
        for spec in catalog:
            node.evict(spec.id, Tier.L1)  # back to disk: the hint has something to do
        core = SchedulerCore(
            catalog=catalog,
            cluster=cluster,
            config=PlannerConfig.from_settings(settings.scheduler),
            dispatch=lambda _orders: None,  # the placed orders are applied to the node below
        )
        core.observe(node.state())
        target = list(catalog)[-1].id
        _, placed = core.add_hint(Hint(model=target, eta_s=0, ttl_s=600, source="chat-page"))
        _say("scheduler", f"hint 'chat-page opens {target}' → {len(placed)} order(s)")
        for order in placed:
            outcome = node.apply(order)
            typer.echo(
                f"    {order.action} {order.model} → {order.tier} ({order.reason}): {outcome.status} "
                f"in {outcome.seconds * 1000:.0f} ms from {outcome.served_from}"
            )

    # 6. simulation ----------------------------------------------------------------------------------
    from forecaster import LiveForecasts
    from prewarm_cli._sim import render_table
    from sim import available, default_cluster, run_policies, sweep, virtual_catalog

    start = DEMO_START + (days - 1) * 86400 + 6 * 3600
    catalog_sim = virtual_catalog(trace.models)
    planner = PlannerConfig.from_settings(settings.scheduler)

    def simulate(labels: list[str], *, unlimited: bool) -> dict[str, SimMetrics]:
        return run_policies(
            trace.events,
            catalog_sim,
            None if unlimited else default_cluster(nodes=1),
            labels,
            start=start,
            end=start + sim_hours * 3600,
            forecasts=LiveForecasts(bundle),
            planner=planner,
            unlimited=unlimited,
        )

    _say(
        "simulation",
        f"day {days}, 06:00 + {sim_hours:g} h, {fleet} models of 14-140 GB on one node "
        "(2 × 80 GB GPU, 400 GB host cache, 2 TB NVMe):",
    )
    typer.echo(render_table(simulate(available(), unlimited=False)))
    # The serverless comparison: one tier without limit, instant loads; each policy's knob swept.
    swept = sweep(
        lambda labels: {k: m.to_json() for k, m in simulate(labels, unlimited=True).items()},
        {
            "keepalive": ["60", "600", "3600"],
            "histogram": ["60", "240"],
            "prewarm": ["0.001", "0.003", "0.03"],
            "oracle": [],
        },
    )
    png = swept.to_png(root / "pareto.png")
    _say("policies", f"unlimited memory, idle GB-minutes against p75 per-model cold-start rate: {png}")
    typer.echo(swept.table())

    # 7. engine --------------------------------------------------------------------------------------
    from prewarm_cli._demo_engine import run_engine_demo

    engine = run_engine_demo(root / "engine")
    if engine.get("ok"):
        _say(
            "engine",
            f"a separate transformers process took {engine['model']} from the executor's L1 in "
            f"{engine['engine_load_from_l1_s']:.2f} s, read {engine['engine_read_bytes_from_l1']} weight "
            f"bytes from disk, and generated the same tokens as from the files: {engine['tokens']}",
        )
    else:
        _say("engine", f"not started warm: {engine.get('reason', engine)}")
    _say("done", f"in {time.perf_counter() - began:.0f} s; everything is under {root}")


def _made_with(path: Path, params: str) -> bool:
    """Whether ``path`` exists and was made from ``params`` (recorded beside it). If not, it is removed
    and ``params`` recorded, for the caller to make it again: a rerun with other flags never reports on
    what an earlier run left."""
    stamp = path.with_name(f"{path.name}.params")
    if path.exists() and stamp.exists() and stamp.read_text() == params:
        return True
    for side in ("", "-wal", "-shm", "-journal"):  # a SQLite file goes with its side files
        path.with_name(path.name + side).unlink(missing_ok=True)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(params)
    return False
