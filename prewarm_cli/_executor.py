"""``prewarm executor``: load weights through L3 -> L2 -> L1 -> L0, verify caches, report state.

Also registers ``prewarm bench load``, the loader benchmark (executor/_bench.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prewarm_cli._common import (
    app_group,
    bench_app,
    catalog_path,
    output_path,
    progress,
    settings_of,
    size_option,
    write_json,
)

if TYPE_CHECKING:
    from executor import Executor
    from models import Catalog
    from prewarm import Settings

app = app_group(
    "The GPU-node executor: load weights through L3 -> L2 -> L1 -> L0, verify caches, report state."
)

_CATALOG = typer.Option(None, "--catalog", help="Catalog YAML (default: PREWARM_CATALOG).")
_CACHE_DIR = typer.Option(None, "--cache-dir", help="L2 directory (default: PREWARM_CACHE_DIR).")
_DEVICE = typer.Option(None, "--device", help="cpu, cuda or cuda:N (default: PREWARM_DEVICE).")
_JSON = typer.Option(
    None, "--json", callback=output_path, help="Write the result as JSON to this file ('-' = stdout)."
)


def _catalog(path: Path | None, settings: Settings, *, required: bool) -> Catalog:
    from models import Catalog

    if path is None and settings.core.catalog is None and not required:
        return Catalog([])
    return Catalog.load(catalog_path(path, settings))


def _executor(
    ctx: typer.Context, catalog: Path | None, cache_dir: Path | None, device: str | None, *, required: bool
) -> Executor:
    from executor import Executor

    settings = settings_of(ctx)
    return Executor(
        _catalog(catalog, settings, required=required), settings, cache_dir=cache_dir, device=device
    )


@app.command()
def load(
    ctx: typer.Context,
    model_id: str = typer.Argument(..., help="Model id from the catalog."),
    catalog: Path | None = _CATALOG,
    cache_dir: Path | None = _CACHE_DIR,
    tier: str = typer.Option("L0", "--tier", help="L0, L1 or L2: how close to the GPU to bring it."),
    device: str | None = _DEVICE,
    json_out: Path | None = _JSON,
) -> None:
    """Bring one model to a tier and report where it came from and how long each hop took."""
    from prewarm import Tier

    try:
        target = Tier(tier.upper())
    except ValueError:
        raise typer.BadParameter("must be L0, L1 or L2", param_hint="--tier") from None
    with _executor(ctx, catalog, cache_dir, device, required=True) as executor:
        result = executor.ensure(model_id, target, demand=True)
    payload = result.to_json()
    write_json(payload, json_out or Path("-"))


@app.command()
def verify(
    ctx: typer.Context,
    cache_dir: Path | None = _CACHE_DIR,
    json_out: Path | None = _JSON,
) -> None:
    """Re-hash every L2 object with sha256; corrupt ones are evicted. Exit status 1 if any was bad."""
    with _executor(ctx, None, cache_dir, "cpu", required=False) as executor:
        results = executor.verify()
    if json_out is not None:
        write_json([vars(r) for r in results], json_out)
    else:
        for r in results:
            typer.echo(f"{'ok ' if r.ok else 'BAD'}\t{r.sha256}\t{r.model}\t{r.detail}")
        typer.echo(f"{sum(r.ok for r in results)}/{len(results)} objects intact")
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@app.command()
def state(
    ctx: typer.Context,
    catalog: Path | None = _CATALOG,
    cache_dir: Path | None = _CACHE_DIR,
    device: str | None = _DEVICE,
    json_out: Path | None = _JSON,
) -> None:
    """What this node holds per tier (a fresh process holds only L2) as the executor-state message."""
    with _executor(ctx, catalog, cache_dir, device, required=False) as executor:
        snapshot = executor.state()
    write_json(snapshot.model_dump(mode="json"), json_out or Path("-"))


@bench_app.command("load")
def bench_load(
    ctx: typer.Context,
    size: str = typer.Option("2GiB", "--size", help="Size of the synthetic safetensors file."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    work_dir: Path = typer.Option(
        Path(".prewarm/bench-load"), "--dir", help="Scratch directory (on the L2 disk)."
    ),
    bucket: str | None = typer.Option(
        None, "--bucket", help="S3 bucket for the L3 figures (needs PREWARM_S3_ENDPOINT); unset = null."
    ),
    repeat: int = typer.Option(1, "--repeat", min=1, help="Runs, interleaved; each figure is the best."),
    keep: bool = typer.Option(False, "--keep", help="Keep the scratch files."),
    json_out: Path | None = _JSON,
) -> None:
    """L2->L1, L1->L0, L2->L0 and L3->L1 against raw reads, safetensors and boto3 in the same run."""
    from executor import run_load_benchmark

    nbytes = size_option(size)
    report = run_load_benchmark(
        settings_of(ctx),
        nbytes=nbytes,
        device=device,
        work_dir=work_dir,
        bucket=bucket,
        repeat=repeat,
        keep=keep,
        progress=progress,
    )
    write_json(report, json_out or Path("-"))
