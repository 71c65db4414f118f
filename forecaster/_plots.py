"""Backtest plots (PNG, matplotlib's Agg backend): reliability diagram and forecast-vs-actual."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from forecaster._backtest import BacktestReport
from forecaster._types import ModelForecast

__all__ = ["backtest_plots", "forecast_plot"]


def _pyplot() -> Any:  # matplotlib is untyped
    import matplotlib

    matplotlib.use("Agg")  # never a display; this runs in services and CI
    import matplotlib.pyplot as plt

    return plt


def backtest_plots(report: BacktestReport, out_dir: Path, max_models: int = 6) -> list[Path]:
    """``reliability.png`` and ``forecast_vs_actual.png`` (the busiest few models, first test day)."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(5, 5))
    mean_p = [b["mean_p"] for b in report.reliability]
    observed = [b["observed"] for b in report.reliability]
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfect")
    ax.plot(mean_p, observed, marker="o", label="forecaster")
    agg = report.aggregate
    ax.set_title(f"Reliability (ECE {agg['ece']:.3f}), Brier skill {agg['brier_skill']:.3f}")
    ax.set_xlabel(f"P(any request in {agg['window_minutes']} min, lead {agg['lead_minutes']} min)")
    ax.set_ylabel("observed frequency")
    ax.legend()
    path = out_dir / "reliability.png"
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)
    paths.append(path)

    test = report.test
    volume = np.nansum(test.counts, axis=1)
    rows = [int(i) for i in np.argsort(-volume)[:max_models]]
    if rows:
        span = min(test.minutes, 1440)
        stamps = test.timestamps()[:span]
        rates = report.bundle.rates(stamps, [test.models[i] for i in rows])
        fig, axes = plt.subplots(len(rows), 1, figsize=(10, 1.8 * len(rows)), sharex=True, squeeze=False)
        hours = (stamps - stamps[0]) / 3600.0
        for ax, i, rate in zip(axes[:, 0], rows, rates, strict=True):
            actual = (
                np.nan_to_num(test.counts[i, : span // 10 * 10]).reshape(span // 10, 10).sum(axis=1)
                if span >= 10
                else []
            )
            ax.bar(
                hours[::10][: len(actual)], actual, width=10 / 60, color="lightgrey", label="actual / 10 min"
            )
            ax.plot(hours, rate * 10, color="C0", label="expected / 10 min")
            ax.set_ylabel(test.models[i], fontsize=7)
        axes[0, 0].legend(fontsize=7)
        axes[-1, 0].set_xlabel("hours after the training cut")
        path = out_dir / "forecast_vs_actual.png"
        fig.savefig(path, dpi=80, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def forecast_plot(fc: ModelForecast, model: str, actual: np.ndarray | None, out: Path) -> Path:
    """Expected requests and P(any) per bucket for one model, with actual counts when known."""
    plt = _pyplot()
    minutes = (np.arange(len(fc.expected)) * fc.bucket_s) / 60.0
    fig, ax = plt.subplots(figsize=(10, 3))
    if actual is not None:
        ax.bar(minutes, actual[: len(minutes)], width=fc.bucket_s / 60.0, color="lightgrey", label="actual")
    ax.plot(minutes, fc.expected, color="C0", label="expected")
    ax2 = ax.twinx()
    ax2.plot(minutes, fc.p_any, color="C1", label="P(any)")
    ax2.set_ylim(0, 1)
    ax.set_xlabel("minutes after now")
    ax.set_title(f"{model} ({fc.family})")
    ax.legend(loc="upper left", fontsize=7)
    ax2.legend(loc="upper right", fontsize=7)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, bbox_inches="tight")
    plt.close(fig)
    return out
