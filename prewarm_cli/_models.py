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
    out: Path = typer.Option(..., "--out", help="Directory for the weights and catalog.yaml."),
    sizes: str = typer.Option("64MB,256MB,1GB", help="Comma-separated target sizes, cycled over models."),
    count: int | None = typer.Option(None, min=1, help="Number of models (default: one per size)."),
    dtype: str = typer.Option("F16", help="F16 or BF16."),
    prefix: str = typer.Option("demo", help="Model id prefix."),
    hf: bool = typer.Option(
        False,
        "--hf",
        help="Write Hugging Face checkpoints (config.json, index, shards) in <out>/<id>/ instead of "
        "single .safetensors files.",
    ),
    shards: int = typer.Option(2, min=1, help="With --hf: safetensors shards per checkpoint."),
) -> None:
    """Write real safetensors weights with transformer layouts and a catalog with file:// uris."""
    from models import synth_catalog

    catalog = synth_catalog(
        out, _parse_sizes(sizes), count, dtype=dtype.upper(), prefix=prefix, shards=shards if hf else None
    )
    for spec in catalog:
        typer.echo(f"{spec.id}\t{spec.size_bytes}\t{spec.sha256}")
    if hf:
        # Said once, so nobody looks for them: an engine fed token ids needs none.
        typer.echo("tokenizer files: not written (the tokenizers library is not a dependency)")
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
    uri: str = typer.Argument(
        ...,
        help="A safetensors file (s3://bucket/key, file:///path) or a Hugging Face checkpoint: a local "
        "directory, file:///dir/ or an s3://bucket/prefix/.",
    ),
    model_id: str = typer.Option(..., "--id", help="Model id."),
    version: str = typer.Option("1", help="Model version."),
    catalog: Path | None = typer.Option(None, help="Catalog to update (default: PREWARM_CATALOG)."),
    exclude: list[str] = typer.Option(
        [],
        "--exclude",
        help="Leave out files matching this glob (repeatable), besides non-safetensors weights.",
    ),
) -> None:
    """Add (or replace) an entry after reading its files' sizes and sha256 from the store."""
    from executor import DEFAULT_EXCLUDES, describe_entry
    from models import Catalog

    settings = settings_of(ctx)
    path = catalog_path(catalog, settings)
    if "://" not in uri:
        local = Path(uri).resolve()
        uri = local.as_uri() + ("/" if local.is_dir() else "")
    found = describe_entry(
        uri, settings.s3, model_id=model_id, version=version, exclude=(*DEFAULT_EXCLUDES, *exclude)
    )
    spec = found.spec
    current = Catalog.load(path) if path.exists() else Catalog([])
    current.with_spec(spec).save(path)
    for f in spec.files:
        typer.echo(f"  {f.path}\t{f.size_bytes}\t{f.sha256}")
    for line in found.left_out:
        typer.echo(f"  left out: {line}")
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
