"""Per-model seasonal demand forecasts with backtested model selection and MLflow-tracked retraining."""

from __future__ import annotations

from forecaster._types import ModelForecast

__all__ = ["ModelForecast"]
