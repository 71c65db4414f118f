"""``prewarm sim sweep``: each policy's knob swept over one trace, and the Pareto curves it draws.

The command function ``sweep`` is registered on the ``sim`` sub-app by ``prewarm_cli/__init__.py``
(``_sim.app.command("sweep")(_sweep.sweep)``), so that this module and ``_sim.py`` stay apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import typer

from prewarm import InvalidInput
from prewarm_cli._common import (
    TRACE_FORMAT_HELP,
    TRACE_HELP,
    check_png,
    output_path,
    trace_format,
    write_json,
)

__all__ = ["parse_grid", "sweep"]


def parse_grid(
    policies: Sequence[str], knobs: Sequence[str], defaults: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """The knob values to sweep per policy kind.

    ``policies`` are kinds (``keepalive``: its default grid) or labels (``keepalive:600``: that value);
    none means every kind of ``defaults``. ``knobs`` are ``KIND=v1,v2,...`` and replace a kind's grid
    (naming a kind is enough to sweep it). A kind with no values runs once, bare."""
    grid: dict[str, list[str]] = {}
    for entry in policies or list(defaults):
        kind, sep, knob = entry.partition(":")
        values = grid.setdefault(kind, [])
        if sep:
            if not knob:
                raise InvalidInput(f"--policy {entry!r}: empty knob after ':'")
            values.append(knob)
        else:
            values.extend(defaults.get(kind, ()))
    for entry in knobs:
        kind, sep, raw = entry.partition("=")
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not sep or not kind or not values:
            raise InvalidInput(f"--knobs {entry!r}: expected KIND=v1,v2,...")
        grid[kind] = values
    return {kind: tuple(dict.fromkeys(values)) for kind, values in grid.items()}


def sweep(
    ctx: typer.Context,
    trace: list[Path] = typer.Option(..., exists=True, dir_okay=False, help=TRACE_HELP),
    fmt: str = typer.Option("requests", "--format", help=TRACE_FORMAT_HELP),
    catalog_file: Path | None = typer.Option(
        None, "--catalog", exists=True, dir_okay=False, help="Catalog (default: virtual sizes)."
    ),
    cluster_file: Path | None = typer.Option(
        None, "--cluster", exists=True, dir_okay=False, help="Cluster YAML (default: 2 nodes)."
    ),
    train_days: float = typer.Option(7.0, help="Days at the start of the trace the forecaster learns from."),
    sim_hours: float = typer.Option(24.0, help="Hours after the training part to simulate."),
    hints_file: Path | None = typer.Option(
        None, "--hints", exists=True, dir_okay=False, help="Hints CSV (timestamp,model,ttl_s)."
    ),
    unlimited: bool = typer.Option(
        False, "--unlimited", help="One tier, unlimited memory, instant loads (the serverless comparison)."
    ),
    policies: list[str] = typer.Option(
        [], "--policy", help="Policy kind to sweep over its default knobs, or KIND:KNOB (repeatable)."
    ),
    knobs: list[str] = typer.Option(
        [], "--knobs", help="KIND=v1,v2,... : the knob values to sweep for KIND (repeatable)."
    ),
    png: Path = typer.Option(
        Path("pareto.png"), "--png", callback=output_path, dir_okay=False, help="Where to draw the curves."
    ),
    out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write every point and its metrics as JSON here."
    ),
) -> None:
    """Sweep each policy's knob on TRACE and draw idle GB-minutes (L0+L1) against the p75 per-model
    cold-start rate and against the share of requests waiting > 5 s, one Pareto front per policy."""
    from ingest import read_trace
    from prewarm_cli._sim import compare_trace
    from sim import DEFAULT_KNOBS, policy_kinds
    from sim import sweep as run_sweep

    check_png(png)
    kinds = policy_kinds()
    grid = parse_grid(policies, knobs, {k: v for k, v in DEFAULT_KNOBS.items() if k in kinds})
    unknown = [kind for kind in grid if kind not in kinds]
    if unknown:
        raise InvalidInput(f"unknown policy {', '.join(unknown)}: known are {', '.join(kinds)}")
    events = read_trace(trace, trace_format(fmt))
    quiet = out is not None and str(out) == "-"

    def run(labels: list[str]) -> Mapping[str, Mapping[str, Any]]:
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
            quiet=quiet,
        )
        return {label: m.to_json() for label, m in results.items()}

    result = run_sweep(run, grid)
    result.to_png(png)
    typer.echo(result.table(), err=quiet)
    doc = result.to_json()
    if "prewarm" in result.families() and len(result.families()) > 1:
        for against in result.measures():
            typer.echo(result.matched_table("prewarm", against), err=quiet)
        doc["matched"] = [m.to_json() for a in result.measures() for m in result.matched("prewarm", a)]
    typer.echo(f"Pareto plot: {png}", err=quiet)
    if out is not None:
        write_json(doc, out)
