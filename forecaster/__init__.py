"""Per-model seasonal demand forecasts with backtested model selection and MLflow-tracked retraining.

For the scheduler: ``ForecasterBundle.predict(now, horizon_s, recent=None) -> {model: ModelForecast}``
(``recent``: requests per model in the last ``state_minutes``, which sharpens the first 20 minutes for
session-like demand), loaded with ``load_forecaster("models:/prewarm-forecaster@champion")`` or from a
local directory; ``retrain(settings, store | frame | History | SeriesSource, now) -> RetrainResult``
for its daily cron job (fitted chunk by chunk, ``forecast.retrain_chunk_models`` models each, on an
``Engine``: this process, a local Dask pool of ``forecast.retrain_workers`` processes, or the Dask cluster at
``forecast.engine_address``; ``open_engine`` makes one to reuse across retrains); and, for models no
trained bundle covers, ``recent_rate_forecasts(counts, now)``, the no-training forecast from the last
hour's requests. Between retrains, ``LiveForecasts(bundle)`` is the bundle conditioned on what was
observed since (``observe(model, at)``): the time since each model's last request (its ``IdleProfile``,
fitted by ``fit_bundle``), recent arrivals, and models the bundle has never seen.

For people and benchmarks: ``History`` (per-minute counts), ``backtest`` (train before a cut, score after it
against a constant-rate and a time-of-week baseline), ``fit_bundle``, and the family registry ``FAMILIES``
(``forecaster.families``: one module per family behind one ``Family`` interface), the plots
``backtest_plots`` and ``forecast_plot``, ``run_forecast_bench`` (``prewarm bench forecast``),
``run_retrain_scaling`` (its ``--workers``: one retrain per worker count on ``SyntheticSeries``, generated
chunk by chunk) and ``run_tail_bench`` (``LiveForecasts`` against the bundle on long-tail patterns,
held-out days).
"""

from __future__ import annotations

from forecaster._backtest import BacktestReport, backtest, fit_bundle
from forecaster._bench import ForecastBench, RetrainTiming, run_forecast_bench
from forecaster._bundle import BUNDLE_VERSION, ForecasterBundle
from forecaster._chunked import SeriesChunk, SeriesSource, SyntheticSeries
from forecaster._engine import Engine, open_engine
from forecaster._history import History
from forecaster._idle import IdleProfile
from forecaster._live import LiveForecasts
from forecaster._plots import backtest_plots, forecast_plot
from forecaster._recent_rate import recent_rate_forecasts
from forecaster._retrain import RetrainResult, retrain, selection_config, tracking_uri_of
from forecaster._scale_bench import run_retrain_scaling
from forecaster._select import Choice, SelectionConfig
from forecaster._tail_bench import TailBench, run_tail_bench
from forecaster._tracking import CHAMPION, RegisterDecision, champion_version, load_forecaster
from forecaster._types import ModelForecast
from forecaster.families import FAMILIES, Family

__all__ = [
    "BUNDLE_VERSION",
    "CHAMPION",
    "FAMILIES",
    "BacktestReport",
    "Choice",
    "Engine",
    "Family",
    "ForecastBench",
    "ForecasterBundle",
    "History",
    "IdleProfile",
    "LiveForecasts",
    "ModelForecast",
    "RegisterDecision",
    "RetrainResult",
    "RetrainTiming",
    "SelectionConfig",
    "SeriesChunk",
    "SeriesSource",
    "SyntheticSeries",
    "TailBench",
    "backtest",
    "backtest_plots",
    "champion_version",
    "fit_bundle",
    "forecast_plot",
    "load_forecaster",
    "open_engine",
    "recent_rate_forecasts",
    "retrain",
    "run_forecast_bench",
    "run_retrain_scaling",
    "run_tail_bench",
    "selection_config",
    "tracking_uri_of",
]
