"""``prewarm bench handoff``: an engine from a cold L2 directory against the same engine from L1 over
the hand-off socket (executor/_handoff_bench.py). Importing this module adds the command."""

from __future__ import annotations

from pathlib import Path

import typer

from prewarm_cli._common import bench_app, output_path, progress, settings_of, size_option, write_json

__all__ = ["bench_handoff"]


@bench_app.command("handoff")
def bench_handoff(
    ctx: typer.Context,
    size: str = typer.Option("2GiB", "--size", help="Size of the synthetic checkpoint's weights."),
    device: str = typer.Option("cpu", "--device", help="Where the engine wants its tensors: cpu or cuda."),
    work_dir: Path = typer.Option(
        Path(".prewarm/bench-handoff"), "--dir", help="Scratch directory (L3 and L2 live under it)."
    ),
    repeat: int = typer.Option(1, "--repeat", min=1, help="Runs, alternated; each figure is the best."),
    keep: bool = typer.Option(False, "--keep", help="Keep the synthetic checkpoint for the next run."),
    json_out: Path | None = typer.Option(
        None, "--json", callback=output_path, help="Write the report here ('-' = stdout)."
    ),
) -> None:
    """Engine start from disk vs from prewarm's L1 (and L0 on CUDA), same model, same run."""
    from executor import run_handoff_benchmark

    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise typer.BadParameter("must be cpu or cuda[:N]", param_hint="--device")
    nbytes = size_option(size)
    report = run_handoff_benchmark(
        settings_of(ctx),
        nbytes=nbytes,
        device=device,
        work_dir=work_dir,
        repeat=repeat,
        keep=keep,
        progress=progress,
    )
    write_json(report, json_out or Path("-"))
