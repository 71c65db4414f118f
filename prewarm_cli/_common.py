"""What every CLI module shares: the settings of this invocation, error translation, sub-app registry."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from typer.core import TyperGroup

from prewarm import ConfigError, InvalidInput, PrewarmError, Settings, UnknownModel, epoch_seconds

if TYPE_CHECKING:
    from ingest import TraceFormat

__all__ = [
    "TRACE_FORMAT_HELP",
    "TRACE_HELP",
    "app_group",
    "bench_app",
    "catalog_path",
    "check_png",
    "fail",
    "output_path",
    "parse_time",
    "settings_of",
    "trace_format",
    "write_json",
]

TRACE_HELP = (
    "Trace file (see --format); repeat it for a trace in several files: Azure 2019 day files in day "
    "order, the first at the default start."
)
TRACE_FORMAT_HELP = (
    "requests (timestamp,model), azure2019 (per-minute counts) or azure2021 (one row per invocation)."
)

# Errors the user can fix by changing what they passed: exit status 2, like a usage error.
_USAGE_ERRORS = (ConfigError, InvalidInput, UnknownModel)


class _PrewarmGroup(TyperGroup):
    """Turns a ``PrewarmError`` from any command into one line on stderr and an exit status."""

    def invoke(self, ctx: Any) -> Any:  # typer vendors click; its Context type is private
        try:
            return super().invoke(ctx)
        except PrewarmError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2 if isinstance(exc, _USAGE_ERRORS) else 1) from exc


def app_group(help: str) -> typer.Typer:
    """A sub-app with prewarm's error handling and ``--help`` on every command."""
    return typer.Typer(
        help=help,
        cls=_PrewarmGroup,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )


# Each package's CLI module registers its benchmark here (``prewarm bench load``, ``bench ingest`` ...).
bench_app = app_group("Benchmarks that measure a ratio against a baseline in the same run.")


def settings_of(ctx: typer.Context) -> Settings:
    """The settings built once by the top-level callback."""
    root = ctx.find_root()
    settings = root.obj
    if not isinstance(settings, Settings):
        raise RuntimeError("settings were not loaded by the root callback")
    return settings


def catalog_path(option: Path | None, settings: Settings) -> Path:
    """The catalog a command works on: ``--catalog``, else ``PREWARM_CATALOG``, else a usage error."""
    path = option or settings.core.catalog
    if path is None:
        raise ConfigError("no catalog: pass --catalog or set PREWARM_CATALOG", setting="PREWARM_CATALOG")
    return path


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def progress(line: str) -> None:
    """Where a long command's progress lines go: standard error, so that its JSON on stdout stays clean."""
    typer.echo(line, err=True)


def write_json(payload: Any, out: Path | None) -> None:
    """Write ``payload`` to ``out`` (``-`` or unset: stdout)."""
    text = json.dumps(payload, indent=2, sort_keys=False, default=str)
    if out is None or str(out) == "-":
        sys.stdout.write(text + "\n")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def output_path(value: Path | None) -> Path | None:
    """An output file option's callback: refuse, before any work, a path no file can be written to (a
    folder, or one under a file), so a long run does not end in a traceback that loses its result."""
    if value is None or str(value) == "-":
        return value
    if value.is_dir():
        raise typer.BadParameter(f"{value} is a folder: name a file in it")
    blocked = next((p for p in value.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise typer.BadParameter(f"{blocked} is a file, so {value} cannot be written")
    return value


def check_png(path: Path | None, option: str = "--png") -> None:
    """Refuse, before any work, a plot file matplotlib would not write as a PNG."""
    if path is not None and path.suffix.lower() != ".png":
        raise InvalidInput(f"{option} {path}: the plot is drawn as a PNG, name a .png file")


def trace_format(value: str) -> TraceFormat:
    """``--format``'s value, one of the trace formats ``ingest.read_trace`` reads (a usage error if not)."""
    from ingest import TRACE_FORMATS

    if value not in TRACE_FORMATS:
        raise typer.BadParameter(f"expected one of {', '.join(TRACE_FORMATS)}", param_hint="--format")
    return value


def parse_time(value: str, option: str = "time") -> float:
    """Epoch seconds from a number or an ISO-8601 time (UTC when no offset is given)."""
    try:
        return epoch_seconds(value)
    except ValueError as exc:
        raise InvalidInput(f"{option}: {exc}", reason="time") from None


@contextlib.contextmanager
def progress_bar(enabled: bool) -> Iterator[Callable[[str, float], None] | None]:
    """A rich progress bar per policy on a terminal; None (no output) when not ``enabled``, in CI, or when
    standard error is not a terminal."""
    if not enabled or os.environ.get("CI") or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress as Bars

    with Bars(transient=True) as bars:
        tasks: dict[str, Any] = {}

        def report(label: str, fraction: float) -> None:
            if label not in tasks:
                tasks[label] = bars.add_task(label, total=1.0)
            bars.update(tasks[label], completed=min(max(fraction, 0.0), 1.0))

        yield report


def size_option(value: str, option: str = "--size") -> int:
    """Bytes from a size option ("2GiB", "512MB"); a bad one is the option's usage error."""
    from prewarm import parse_bytes

    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc
