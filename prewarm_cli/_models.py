"""``prewarm models``: synthesize demo weights, check and extend catalogs."""

from __future__ import annotations

from pathlib import Path

import typer

from prewarm_cli._common import app_group, catalog_path, settings_of

app = app_group("The model catalog: synthesize demo weights, register and check entries.")


def _parse_sizes(text: str) -> list[int]:
    from prewarm import parse_bytes

    try:
        return [parse_bytes(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--sizes") from exc


@app.command()
def synth(
    out: Path = typer.Option(..., "--out", help="Directory for the .safetensors files and catalog.yaml."),
    sizes: str = typer.Option("64MB,256MB,1GB", help="Comma-separated target sizes, cycled over models."),
    count: int | None = typer.Option(None, min=1, help="Number of models (default: one per size)."),
    dtype: str = typer.Option("F16", help="F16 or BF16."),
    prefix: str = typer.Option("demo", help="Model id prefix."),
) -> None:
    """Write real safetensors files with transformer layouts and a catalog with file:// uris."""
    from models import synth_catalog

    catalog = synth_catalog(out, _parse_sizes(sizes), count, dtype=dtype.upper(), prefix=prefix)
    for spec in catalog:
        typer.echo(f"{spec.id}\t{spec.size_bytes}\t{spec.sha256}")
    typer.echo(f"wrote {out / 'catalog.yaml'} ({len(catalog)} models)")


@app.command()
def check(catalog: Path = typer.Argument(..., help="Catalog YAML to validate.")) -> None:
    """Validate a catalog: exit 0 if good, 2 with one line per problem otherwise."""
    from models import Catalog, CatalogProblem

    try:
        loaded = Catalog.load(catalog)
    except CatalogProblem as exc:
        for line in exc.problems:
            typer.echo(f"{catalog}: {line}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"{catalog}: ok ({len(loaded)} models)")


@app.command()
def register(
    ctx: typer.Context,
    uri: str = typer.Argument(..., help="s3://bucket/key or file:///path of a safetensors file."),
    model_id: str = typer.Option(..., "--id", help="Model id."),
    version: str = typer.Option("1", help="Model version."),
    catalog: Path | None = typer.Option(None, help="Catalog to update (default: PREWARM_CATALOG)."),
) -> None:
    """Add (or replace) an entry after reading its size and sha256 from the object store."""
    from executor import open_store
    from models import Catalog, ModelSpec

    settings = settings_of(ctx)
    path = catalog_path(catalog, settings)
    store = open_store(uri, settings.s3)
    spec = ModelSpec(
        id=model_id, version=version, uri=uri, size_bytes=store.size(uri), sha256=store.sha256(uri)
    )
    current = Catalog.load(path) if path.exists() else Catalog([])
    current.with_spec(spec).save(path)
    typer.echo(f"{spec.id}\t{spec.version}\t{spec.size_bytes}\t{spec.sha256}")


@app.command("list")
def list_models(
    ctx: typer.Context,
    catalog: Path | None = typer.Option(None, help="Catalog (default: PREWARM_CATALOG)."),
) -> None:
    """List the models of a catalog."""
    from models import Catalog
    from prewarm import format_bytes

    for spec in Catalog.load(catalog_path(catalog, settings_of(ctx))):
        typer.echo(f"{spec.id}\t{spec.version}\t{format_bytes(spec.size_bytes)}\t{spec.priority}\t{spec.uri}")
