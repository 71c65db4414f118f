"""``prewarm demo``: the whole system on embedded defaults, no services needed.

Each capability adds its step here as it lands; the demo runs what exists.
"""

from __future__ import annotations

from pathlib import Path

import typer

from prewarm.cli._common import settings_of


def demo(
    ctx: typer.Context,
    workdir: Path | None = typer.Option(None, help="Working directory (default: data_dir/demo)."),
    sizes: str = typer.Option("64MB,64MB,256MB", help="Sizes of the synthesized demo models."),
) -> None:
    """Run prewarm end to end on embedded defaults: synthesize models, and run each stage that exists."""
    from models import Catalog, synth_catalog
    from prewarm import format_bytes, parse_bytes

    settings = settings_of(ctx)
    root = (workdir or settings.core.data_dir / "demo").resolve()
    catalog_path = settings.core.catalog
    if catalog_path is not None:
        catalog = Catalog.load(catalog_path)
        typer.echo(f"[catalog] {len(catalog)} models from {catalog_path}")
    else:
        catalog_path = root / "weights" / "catalog.yaml"
        if catalog_path.exists():
            catalog = Catalog.load(catalog_path)
        else:
            catalog = synth_catalog(root / "weights", [parse_bytes(s) for s in sizes.split(",")])
        typer.echo(f"[catalog] {len(catalog)} synthesized models in {catalog_path}")
    for spec in catalog:
        typer.echo(f"  {spec.id:<12} v{spec.version}  {format_bytes(spec.size_bytes):>10}  {spec.uri}")
