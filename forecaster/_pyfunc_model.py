"""The MLflow pyfunc face of a forecaster bundle, logged as *model code* (no pickled object).

MLflow copies this file into the logged model and executes it on ``mlflow.pyfunc.load_model``; the
fitted state is the bundle's JSON, shipped as the artifact ``bundle``. ``predict`` takes a frame with a
``now`` column (epoch seconds) and an optional ``horizon_s`` column, and returns one row per model and
bucket: ``now``, ``model``, ``bucket_start``, ``expected``, ``p_any``, ``family``.
"""

from __future__ import annotations

from typing import Any

import mlflow
import pandas as pd
from mlflow.pyfunc.model import PythonModel

from forecaster._bundle import ForecasterBundle


class ForecasterPyfunc(PythonModel):
    bundle: ForecasterBundle

    def load_context(self, context: Any) -> None:
        self.bundle = ForecasterBundle.load(context.artifacts["bundle"])

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        rows: list[dict[str, Any]] = []
        for record in pd.DataFrame(model_input).to_dict("records"):
            horizon = record.get("horizon_s")
            now = float(record["now"])
            forecasts = self.bundle.predict(
                now, None if horizon is None or pd.isna(horizon) else int(horizon)
            )
            for model, fc in forecasts.items():
                for i in range(len(fc.expected)):
                    rows.append(
                        {
                            "now": now,
                            "model": model,
                            "bucket_start": fc.start + i * fc.bucket_s,
                            "expected": float(fc.expected[i]),
                            "p_any": float(fc.p_any[i]),
                            "family": fc.family,
                        }
                    )
        return pd.DataFrame(rows)


mlflow.models.set_model(ForecasterPyfunc())
