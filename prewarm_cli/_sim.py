"""``prewarm sim``: replay a trace through the real planner and the baseline policies, side by side."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from prewarm import abridged
from prewarm_cli._common import (
    TRACE_FORMAT_HELP,
    TRACE_HELP,
    app_group,
    bench_app,
    fail,
    output_path,
    progress,
    progress_bar,
    settings_of,
    trace_format,
    write_json,
)

if TYPE_CHECKING:
    from sim import SimMetrics

app = app_group("Trace-driven cluster simulation: the real planner against baseline policies.")


@app.command()
def run(
    ctx: typer.Context,
    trace: list[Path] = typer.Option(..., exists=True, dir_okay=False, help=TRACE_HELP),
    fmt: str = typer.Option("requests", "--format", help=TRACE_FORMAT_HELP),
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
    out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write the results as JSON here ('-': stdout)."
    ),
) -> None:
    """Fit forecasters on the first days of TRACE, then simulate the next hours under each policy."""
    from ingest import read_trace
    from sim import DEFAULT_POLICIES, available

    events = read_trace(trace, trace_format(fmt))
    labels = list(policies) if policies else available(DEFAULT_POLICIES)
    to_stdout = out is not None and str(out) == "-"
    results = compare_trace(
        ctx,
        events,
        labels,
        train_days=train_days,
        sim_hours=sim_hours,
        catalog_file=catalog_file,
        cluster_file=cluster_file,
        hints_file=hints_file,
        unlimited=unlimited,
        quiet=to_stdout,
    )
    if not to_stdout:
        models = events["model"].nunique()
        typer.echo(f"{models} models, {len(events)} requests in the trace")
        typer.echo(render_table(results))
    if out is not None:
        write_json({label: r.to_json() for label, r in results.items()}, out)


@app.command("compile")
def compile_(
    check: bool = typer.Option(False, "--check", help="Only say whether these sources are compiled."),
) -> None:
    """Compile the simulator's run loop with Cython (the same figures, up to 1.5 x the requests a
    second); the pure modules run wherever no build of the present sources exists. Fast when built."""
    from sim import CompileError, compile_dir, compile_run_loop, is_compiled

    if check:
        where = compile_dir()
        done = is_compiled(where)
        typer.echo(f"{where}: {'compiled' if done else 'not compiled, the pure modules run'}")
        raise typer.Exit(0 if done else 1)
    try:
        compile_run_loop(progress)
    except (CompileError, OSError) as exc:
        fail(f"{exc}\nthe pure modules run", 1)


def compare_trace(
    ctx: typer.Context,
    events: Any,
    labels: list[str],
    *,
    train_days: float,
    sim_hours: float,
    catalog_file: Path | None,
    cluster_file: Path | None,
    hints_file: Path | None,
    unlimited: bool,
    quiet: bool,
) -> dict[str, SimMetrics]:
    """``sim.compare`` on a trace with the files the options name, a progress bar unless ``quiet``:
    what ``sim run`` and ``sim sweep`` both do. Requests and hints for models the catalog lacks are not
    simulated, and said so on stderr."""
    from models import Catalog
    from scheduler import Cluster
    from sim import compare, read_hints

    if unlimited and cluster_file is not None:
        typer.echo(
            f"warning: --cluster {cluster_file} is not used with --unlimited (one tier, no limit)", err=True
        )
    catalog = Catalog.load(catalog_file) if catalog_file else None
    served = set(catalog.ids()) if catalog is not None else set(events["model"].unique().tolist())
    _warn_left_out("requests", events["model"][~events["model"].isin(served)].tolist())
    hints = read_hints(hints_file) if hints_file else ()
    _warn_left_out("hints", [h.model for h in hints if h.model not in served])
    with progress_bar(not quiet) as progress:
        return compare(
            events,
            settings_of(ctx),
            train_days=train_days,
            sim_hours=sim_hours,
            catalog=catalog,
            cluster=Cluster.load(cluster_file) if cluster_file else None,
            labels=labels,
            hints=hints,
            unlimited=unlimited,
            progress=progress,
        )


def _warn_left_out(what: str, models: list[str]) -> None:
    """Say on stderr that ``what`` (one per entry of ``models``) for models the catalog lacks are left out."""
    if models:
        names = sorted(set(models))
        typer.echo(
            f"warning: {len(models):,} {what} for {len(names)} model(s) missing from the catalog are "
            f"not simulated: {abridged(names)}",
            err=True,
        )


def render_table(results: Mapping[str, SimMetrics]) -> str:
    """One row per policy. Waits of a run whose cluster could not keep up are shown as 'unstable'; 'warm'
    counts the GPU copies given up within a minute of their last use (``warm_displacements``)."""
    header = (
        f"{'policy':<16} {'requests':>8} {'cold':>6} {'cold %':>6} {'warm':>6} {'p75 model':>9} {'>1 s':>6} "
        f"{'>5 s':>6} {'p95 s':>9} {'idle GB·min L0/L1':>19} {'prefetch':>8} {'mispred':>7} {'displ':>5} "
        f"{'moved TB':>8} {'>5 s from L1/L2/L3':>18}"
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
            f"{r.warm_displacements:>6} {r.p75_model_cold_start_rate:>9.3f} {waits} {idle_text:>19} "
            f"{r.prefetches:>8} {r.mispredictions:>7} {r.mispredicted_by['displaced']:>5} "
            f"{r.bytes_moved / 1e12:>8.2f} {_slow_from(r):>18}"
        )
    return "\n".join(lines)


def _slow_from(r: SimMetrics) -> str:
    """The requests waiting over 5 s by the tier their load began in (none under ``--unlimited``)."""
    return "" if r.unlimited else "/".join(str(r.slow_from.get(t, 0)) for t in ("L1", "L2", "L3"))


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
    out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write the result as JSON here (default stdout)."
    ),
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


def speed_trace(requests: int, models: int, hours: float, *, seed: int = 0, start: float) -> Any:
    """``requests`` requests of ``models`` models in the ``hours`` from ``start`` (and a day before it, at
    the same rate), popularity log-normal over about four orders of magnitude, with a daily cycle."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    span = (hours + 24) * 3600
    weights = np.exp(rng.normal(0.0, 2.5, size=models))
    drawn = int(requests * span / (hours * 3600) * 1.6)
    picks = rng.choice(models, size=drawn, p=weights / weights.sum())
    offsets = rng.uniform(0, span, size=drawn)
    keep = rng.uniform(size=drawn) < (1 + 0.6 * np.sin(2 * np.pi * offsets / 86400)) / 1.6
    order = np.argsort(offsets[keep])
    ids = np.array([f"model-{i:03d}" for i in range(models)])
    return pd.DataFrame({"timestamp": start - 86400 + offsets[keep][order], "model": ids[picks[keep][order]]})


@bench_app.command("sim-speed")
def bench_sim_speed(
    requests: int = typer.Option(
        260_000, "--requests", min=1, help="Requests in the simulated window (--trace speed only)."
    ),
    models: int = typer.Option(60, "--models", min=1, help="Models of the trace."),
    hours: float = typer.Option(48.0, "--hours", min=0.1, help="Hours simulated."),
    nodes: int = typer.Option(2, "--nodes", min=1, help="Nodes of the default cluster."),
    gpus: int = typer.Option(
        2, "--gpus", min=1, help="80 GB GPUs per node (with 200 GB of host cache and 1 TB of NVMe each)."
    ),
    trace: str = typer.Option(
        "speed",
        "--trace",
        help="speed: the benchmark's own trace, a day before the window at the same rate, model sizes "
        "7-70B; long-tail: the trace suite's fleet (about 520 requests a model a day, 4 h of warm-up), "
        "mostly small models (sim.LONG_TAIL_MIX).",
    ),
    world: str = typer.Option("both", "--world", help="both, cluster or unlimited."),
    seed: int = typer.Option(0, "--seed", help="Trace seed."),
    policies: list[str] | None = typer.Option(None, "--policy", help="Policies (default: the baselines)."),
    out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write the result as JSON here (default stdout)."
    ),
) -> None:
    """Simulated requests per second of the baselines, on the cluster and under --unlimited."""
    import time

    from sim import default_cluster, long_tail, run_policies, running_compiled, virtual_catalog

    if trace not in ("speed", "long-tail"):
        fail(f"--trace must be speed or long-tail, not {trace!r}")
    worlds = {"both": (True, False), "cluster": (False,), "unlimited": (True,)}.get(world)
    if worlds is None:
        fail(f"--world must be both, cluster or unlimited, not {world!r}")
    began = time.perf_counter()
    if trace == "speed":
        start = 1_704_412_800.0
        end = start + hours * 3600
        events = speed_trace(requests, models, hours, seed=seed, start=start)
        catalog = virtual_catalog(sorted(events["model"].unique()))
    else:
        fleet = long_tail(models, hours, seed=seed)
        events, catalog, start, end = fleet.events, fleet.catalog, fleet.start, fleet.end
    made_s = time.perf_counter() - began
    window = events[(events.timestamp >= start) & (events.timestamp < end)]
    typer.echo(
        f"{len(events):,} requests ({len(window):,} in the window) made in {made_s:.1f} s; run loop "
        f"{'compiled' if running_compiled() else 'pure Python (`prewarm sim compile` to compile it)'}",
        err=True,
    )
    cluster = default_cluster(nodes, gpus)
    rows: list[dict[str, Any]] = []
    for unlimited in worlds:
        for label in policies or ["reactive", "keepalive:600", "oracle"]:
            began = time.perf_counter()
            result = run_policies(
                events, catalog, cluster, [label], start=start, end=end, unlimited=unlimited
            )[label]
            seconds = time.perf_counter() - began
            rows.append(
                {
                    "policy": label,
                    "world": "unlimited" if unlimited else f"{nodes} nodes x {gpus} GPUs",
                    "requests": result.requests,
                    "seconds": round(seconds, 2),
                    "requests_per_s": round(len(window) / seconds),
                    "cold_start_rate": round(result.cold_start_rate, 3),
                    "p75_model_cold_start_rate": round(result.p75_model_cold_start_rate, 3),
                    "wait_p99_s": round(result.wait_p99_s, 2),
                    "stable": result.stable,
                    "offered_load": round(result.offered_load, 3),
                    "busiest_link": result.busiest_link,
                }
            )
            typer.echo(
                f"{label:<14} {rows[-1]['world']:<10} {result.requests:>8} requests in {seconds:6.2f} s: "
                f"{rows[-1]['requests_per_s']:>8} /s (cold {result.cold_start_rate:.1%}, "
                f"{'stable' if result.stable else 'UNSTABLE'}: offered load {result.offered_load:.2f} "
                f"on {result.busiest_link or '-'})",
                err=True,
            )
    setup = {
        "trace": trace,
        "models": models,
        "models_requested": int(events["model"].nunique()),
        "catalog_bytes": sum(spec.size_bytes for spec in catalog),
        "nodes": nodes,
        "gpus": gpus,
        "hours": hours,
        "seed": seed,
        "trace_requests": len(events),
        "window_requests": len(window),
        "compiled": running_compiled(),  # the run loop through Cython (`prewarm sim compile`)
    }
    write_json({"setup": setup, "rows": rows}, out)


@bench_app.command("policy")
def bench_policy(
    ctx: typer.Context,
    cases: list[str] | None = typer.Option(None, "--case", help="Suite case (repeatable; default: all)."),
    role: str = typer.Option("all", "--role", help="tune, judge or all: which cases of the suite."),
    where: list[str] | None = typer.Option(
        None,
        "--setting",
        help="unlimited, tight or roomy (repeatable; default: all three; none with --cluster, --roomy-like).",
    ),
    cluster_files: list[Path] | None = typer.Option(
        None,
        "--cluster",
        exists=True,
        dir_okay=False,
        help="Also run every case on this cluster file, judged as tight is (repeatable; named by its stem).",
    ),
    roomy_files: list[Path] | None = typer.Option(
        None,
        "--roomy-like",
        exists=True,
        dir_okay=False,
        help="Also run every case on as many nodes like this cluster file's first one as hold the case's "
        "models in GPU memory at once (its bandwidth), judged as roomy is (repeatable; named roomy-STEM).",
    ),
    policies: list[str] | None = typer.Option(None, "--policy", help="Policy label (repeatable)."),
    out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write every run and target as JSON here."
    ),
    draw: int = typer.Option(
        0, "--draw", help="Build every case from another seed (0: the suite): traffic no knob was chosen on."
    ),
) -> None:
    """Every policy on every case of the trace suite, unlimited / tight / roomy or on a cluster file, and
    prewarm's targets."""
    from scheduler import Cluster
    from sim import DEFAULT_POLICIES, SETTINGS, SUITE_CASES, run_policy_bench, suite

    if role not in ("tune", "judge", "all"):
        fail(f"--role must be tune, judge or all, not {role!r}")
    unknown = sorted(set(cases or ()) - set(SUITE_CASES)) + sorted(set(where or ()) - set(SETTINGS))
    if unknown:
        fail(f"unknown case or setting {unknown}: cases are {', '.join(SUITE_CASES)}")
    if draw < 0:
        fail(f"--draw is 0 (the suite) or a positive number, not {draw}")
    clusters: dict[str, Cluster] = {}
    roomy_like: dict[str, Cluster] = {}
    for option, paths, named, prefix in (
        ("--cluster", cluster_files, clusters, ""),
        ("--roomy-like", roomy_files, roomy_like, "roomy-"),
    ):
        for path in paths or ():
            name = prefix + path.stem
            if name in SETTINGS or name in clusters or name in roomy_like:
                fail(f"{option} {path}: its name {name!r} is taken; rename the file")
            named[name] = Cluster.load(path)
    chosen = [c for c in suite(cases or None, draw=draw) if role in ("all", c.role)]
    quiet = out is not None and str(out) == "-"
    bench = run_policy_bench(
        chosen,
        settings_of(ctx),
        labels=policies or DEFAULT_POLICIES,
        where=[*(where or ([] if clusters or roomy_like else SETTINGS)), *clusters, *roomy_like],
        clusters=clusters,
        roomy_like=roomy_like,
        progress=None if quiet else (lambda line: typer.echo(line, err=True)),
    )
    typer.echo(bench.table(), err=quiet)
    if out is not None:
        write_json({**bench.to_json(), "draw": draw}, out)
