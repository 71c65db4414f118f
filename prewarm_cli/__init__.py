"""The ``prewarm`` command line. Sub-commands import their packages lazily, so ``prewarm --help`` is fast
and a GPU node never imports the control plane."""

from __future__ import annotations

from pathlib import Path

import typer

from prewarm import configure_logging, load_settings, parse_overrides
from prewarm_cli import (
    _demo,
    _executor,
    _executor_run,  # noqa: F401  (registers `prewarm executor run`)
    _forecast,
    _handoff_bench,  # noqa: F401  (registers `prewarm bench handoff`)
    _ingest,
    _models,
    _produce,
    _scheduler,
    _sim,
    _sweep,
)
from prewarm_cli._common import app_group, bench_app

__all__ = ["app", "main"]

app = app_group("prewarm: forecast model demand and prefetch weights before requests arrive.")


@app.callback()
def _root(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML settings file (also PREWARM_CONFIG).", dir_okay=False
    ),
    overrides: list[str] = typer.Option(
        [], "--set", "-s", help="Override a setting: --set kafka_bootstrap=host:9092 (repeatable)."
    ),
) -> None:
    """Settings come from defaults < config file < PREWARM_* environment < --set."""
    settings = load_settings(config, parse_overrides(overrides))
    configure_logging(settings.core.log_level, settings.core.log_format)
    ctx.obj = settings


@app.command()
def version() -> None:
    """Print the prewarm version."""
    from prewarm import __version__

    typer.echo(__version__)


@app.command("settings")
def show_settings(ctx: typer.Context) -> None:
    """Print the effective settings as JSON (secrets masked)."""
    from prewarm_cli._common import settings_of, write_json

    # Secret settings are typed as such; their JSON dump is masked by the type.
    write_json(settings_of(ctx).model_dump(mode="json"), None)


app.add_typer(_models.app, name="models")
app.add_typer(_executor.app, name="executor")
app.add_typer(_ingest.app, name="ingest")
app.add_typer(_produce.app, name="produce")
app.add_typer(_forecast.app, name="forecast")
app.add_typer(_scheduler.app, name="scheduler")
_sim.app.command("sweep")(_sweep.sweep)
app.add_typer(_sim.app, name="sim")
app.add_typer(bench_app, name="bench")
app.command("demo")(_demo.demo)


def main() -> None:
    app()
