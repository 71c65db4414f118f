"""``prewarm bench forecast``: quality and speed of the forecaster on synthetic demand, one run.

Quality: a backtest trained on the first days and scored after them (Brier skill at the configured lead
per pattern family, against a constant-rate and a time-of-week baseline). Speed: generating the
history, the backtest's fit, optionally a full retrain logged to a throw-away MLflow file store and the
load of its champion, and a ``predict`` over the configured horizon (median and worst of seven).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forecaster._backtest import BacktestReport, backtest
from forecaster._history import History
from forecaster._retrain import retrain, selection_config
from forecaster._tracking import load_forecaster
from prewarm import Settings

__all__ = ["ForecastBench", "RetrainTiming", "run_forecast_bench"]

_PREDICT_RUNS = 7


@dataclass(frozen=True)
class RetrainTiming:
    """A full retrain (holdout backtest, final fit, MLflow logging) and loading its champion back."""

    seconds: float
    breakdown: dict[str, float]
    load_champion_seconds: float
    decision: str | None


@dataclass(frozen=True)
class ForecastBench:
    """What one ``run_forecast_bench`` measured; ``to_json`` is the benchmark's published layout."""

    models: int
    days: float
    train_days: float
    seed: int
    report: BacktestReport
    generate_seconds: float
    retrain: RetrainTiming | None
    predict_seconds: list[float]
    predict_models: int
    predict_horizon_s: int

    @property
    def brier_skill(self) -> float:
        return float(self.report.aggregate["brier_skill"])

    @property
    def brier_skill_vs_time_of_week(self) -> float:
        return float(self.report.aggregate["brier_skill_vs_time_of_week"])

    def to_json(self) -> dict[str, Any]:
        speed: dict[str, Any] = {
            "generate_seconds": round(self.generate_seconds, 2),
            "backtest_fit_seconds": self.report.aggregate["fit_seconds"],
        }
        if self.retrain is not None:
            speed["retrain_seconds"] = round(self.retrain.seconds, 2)
            speed["retrain_breakdown"] = self.retrain.breakdown
            speed["load_champion_seconds"] = round(self.retrain.load_champion_seconds, 3)
            speed["retrain_decision"] = self.retrain.decision
        speed["predict_seconds_median"] = round(statistics.median(self.predict_seconds), 4)
        speed["predict_seconds_max"] = round(max(self.predict_seconds), 4)
        speed["predict_models"] = self.predict_models
        speed["predict_horizon_s"] = self.predict_horizon_s
        return {
            "setup": {
                "models": self.models,
                "days": self.days,
                "train_days": self.train_days,
                "seed": self.seed,
            },
            "quality": self.report.aggregate,
            "reliability": self.report.reliability,
            "speed": speed,
            "targets": {
                "brier_skill_ge_0.3": self.brier_skill >= 0.3,
                "beats_time_of_week": self.brier_skill_vs_time_of_week > 0,
                "retrain_under_600s": None if self.retrain is None else speed["retrain_seconds"] < 600,
                "predict_under_1s": speed["predict_seconds_max"] < 1.0,
            },
        }


def run_forecast_bench(
    settings: Settings,
    *,
    models: int = 1000,
    days: float = 14.0,
    train_days: float = 11.0,
    seed: int = 0,
    with_retrain: bool = True,
    progress: Callable[[str], None] = lambda _line: None,
) -> ForecastBench:
    """Backtest ``models`` synthetic series of ``days`` (trained on the first ``train_days``), then time
    a retrain (``with_retrain``) and ``predict``. ``progress`` receives one line per stage."""
    # The synthetic demand comes from ingest's generator; imported here so `import forecaster` stays free
    # of ingest's Kafka and SQL clients.
    from ingest import generate

    f = settings.forecast
    began = time.perf_counter()
    trace = generate(models, days, seed=seed)
    generate_s = time.perf_counter() - began
    history = History(trace.models, int(trace.start), trace.counts.astype("float64"))
    progress(f"generated {models} models x {days:g} days in {generate_s:.1f}s; backtesting")
    report = backtest(
        history,
        trace.start + train_days * 86400,
        lead=f.lead_minutes,
        window=f.window_minutes,
        config=selection_config(settings),
        families=trace.families,
    )
    progress(
        f"backtest: brier skill {report.aggregate['brier_skill']:.3f}, "
        f"vs time-of-week {report.aggregate['brier_skill_vs_time_of_week']:.3f}"
    )
    bundle = report.bundle
    timing = None
    if with_retrain:
        with tempfile.TemporaryDirectory() as tmp:
            uri = (Path(tmp) / "mlruns").as_uri()
            progress("retraining (holdout backtest + final fit + MLflow logging)")
            t0 = time.perf_counter()
            done = retrain(settings, history, float(history.end), tracking_uri=uri)
            retrain_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            # Predict with the champion as the scheduler would load it, not the bundle still in memory.
            bundle = load_forecaster(f"models:/{f.registered_model}@champion", tracking_uri=uri)
            timing = RetrainTiming(
                seconds=retrain_s,
                breakdown=done.timings,
                load_champion_seconds=time.perf_counter() - t0,
                decision=None if done.decision is None else done.decision.reason,
            )
    predict_s = []
    for i in range(_PREDICT_RUNS):
        t0 = time.perf_counter()
        forecasts = bundle.predict(float(history.end) + 60 * i, f.horizon_s)
        predict_s.append(time.perf_counter() - t0)
    return ForecastBench(
        models=models,
        days=days,
        train_days=train_days,
        seed=seed,
        report=report,
        generate_seconds=generate_s,
        retrain=timing,
        predict_seconds=predict_s,
        predict_models=len(forecasts),
        predict_horizon_s=f.horizon_s,
    )
