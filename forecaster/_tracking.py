"""MLflow at the boundary: log a retrain, register it, move ``champion`` only when it is better, load back.

Every MLflow call goes through ``_mlflow_errors``, which turns MLflow's (and its HTTP client's) errors
into ``TrackingError`` with ``transient`` set for connection problems, so callers (the scheduler's cron
job, the CLI) see one exception type and can decide to retry.

Layout of a logged model: a pyfunc logged *from code* (``forecaster/_pyfunc_model.py``) with the bundle's
JSON as its artifact ``bundle``; ``load_forecaster`` reads that JSON directly, so loading the champion
never unpickles anything.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from forecaster._backtest import BacktestReport
from forecaster._bundle import ForecasterBundle
from prewarm._exceptions import ForecastError, TrackingError
from prewarm._logging import get_logger

__all__ = ["CHAMPION", "RegisterDecision", "load_forecaster", "log_retrain"]

log = get_logger(__name__)
CHAMPION = "champion"
# The metric a candidate must beat the champion on. Skill is relative to each run's own constant-rate
# baseline, which keeps runs trained on different weeks comparable; raw Brier would not be.
DECISION_METRIC = "agg.brier_skill"
_PYFUNC_CODE = Path(__file__).with_name("_pyfunc_model.py")


def _signature() -> Any:
    """What the pyfunc takes and returns (``_pyfunc_model.py``); stated, since type hints can't say it."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    inputs = Schema([ColSpec("double", "now"), ColSpec("long", "horizon_s", required=False)])
    outputs = Schema(
        [
            ColSpec("double", "now"),
            ColSpec("string", "model"),
            ColSpec("double", "bucket_start"),
            ColSpec("double", "expected"),
            ColSpec("double", "p_any"),
            ColSpec("string", "family"),
        ]
    )
    return ModelSignature(inputs=inputs, outputs=outputs)


@dataclass(frozen=True)
class RegisterDecision:
    run_id: str
    model_version: str | None
    promoted: bool
    reason: str
    candidate_score: float
    champion_score: float | None


@contextlib.contextmanager
def _mlflow_errors(what: str) -> Iterator[None]:
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        transient = getattr(exc, "error_code", "") in {"TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR"}
        raise TrackingError(f"MLflow: {what}: {exc.message}", transient=transient) from exc
    except (ConnectionError, TimeoutError, OSError) as exc:
        raise TrackingError(f"MLflow: {what}: {exc}", transient=True) from exc
    except Exception as exc:
        # The HTTP client's errors (requests, botocore via the artifact proxy) are not MlflowException.
        module = type(exc).__module__.split(".")[0]
        if module in {"requests", "urllib3", "botocore", "boto3"}:
            raise TrackingError(f"MLflow: {what}: {exc}", transient=True) from exc
        raise


@contextlib.contextmanager
def _tracking(tracking_uri: str) -> Iterator[Any]:
    """A client for ``tracking_uri``, with MLflow's fluent API pointed at it only for the duration.

    ``mlflow.set_tracking_uri`` also writes ``MLFLOW_TRACKING_URI`` into the process environment; the
    previous value is put back, so one retrain cannot redirect everything else in the process.
    """
    import mlflow
    from mlflow import MlflowClient

    if tracking_uri.startswith("file:"):
        # MLflow 3 keeps the file store only behind this opt-in; the embedded default and the tests'
        # tmp stores use it. Set here, at the one boundary that talks to MLflow, not read anywhere else.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    saved_env = os.environ.get("MLFLOW_TRACKING_URI")
    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None  # type: ignore[no-untyped-call]
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    finally:
        mlflow.set_tracking_uri(previous)  # type: ignore[arg-type]  # None unsets it again
        if saved_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env


def log_retrain(
    bundle: ForecasterBundle,
    report: BacktestReport | None,
    *,
    tracking_uri: str,
    experiment: str,
    registered_model: str,
    params: dict[str, Any],
    now: float,
    plots: list[Path] | None = None,
) -> RegisterDecision:
    """Log one retrain as a run, register its model, and promote it to ``champion`` if it is better."""
    import mlflow

    aggregate = report.aggregate if report is not None else {}
    with _mlflow_errors(f"log retrain to {experiment!r}"), _tracking(tracking_uri) as client:
        mlflow.set_experiment(experiment)
        with mlflow.start_run(run_name=f"retrain-{int(now)}") as run, tempfile.TemporaryDirectory() as tmp:
            mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
            metrics = {f"agg.{k}": float(v) for k, v in aggregate.items() if _is_number(v)}
            for pattern, values in (aggregate.get("by_pattern") or {}).items():
                metrics.update(
                    {f"pattern.{pattern}.{k}": float(v) for k, v in values.items() if _is_number(v)}
                )
            if report is not None:
                for model, values in report.per_model.items():
                    for key in ("brier", "brier_baseline", "brier_time_of_week", "poisson_deviance"):
                        metrics[f"model.{model}.{key}"] = float(values[key])
            metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
            mlflow.set_tags(
                {
                    "prewarm.kind": "forecaster-retrain",
                    "prewarm.now": str(now),
                    "prewarm.models": str(len(bundle.models)),
                }
            )
            bundle_dir = bundle.save(Path(tmp) / "bundle")
            mlflow.log_artifacts(str(bundle_dir), artifact_path="params")
            if report is not None:
                (Path(tmp) / "backtest.json").write_text(json.dumps(report.to_json(), indent=1, default=str))
                mlflow.log_artifact(str(Path(tmp) / "backtest.json"), artifact_path="backtest")
            for plot in plots or []:
                mlflow.log_artifact(str(plot), artifact_path="backtest")
            info = mlflow.pyfunc.log_model(
                name="forecaster",
                python_model=str(_PYFUNC_CODE),
                artifacts={"bundle": str(bundle_dir)},
                pip_requirements=[f"mlflow=={mlflow.__version__}", "numpy", "pandas"],
                signature=_signature(),
                # A one-row example documents the call; MLflow checks the model answers it when logging.
                input_example=pd.DataFrame({"now": [float(bundle.trained_until)], "horizon_s": [600]}),
                registered_model_name=registered_model,
            )
            # Metrics go in after the model: MLflow 3's log_model links every metric already on the run
            # to the logged model, one history lookup each, which took minutes for 4000 per-model metrics.
            if metrics:
                mlflow.log_metrics(metrics, step=0)
        run_id = run.info.run_id
        version = str(info.registered_model_version) if info.registered_model_version is not None else None
        score = float(aggregate.get("brier_skill", float("nan")))
        return _decide(client, registered_model, run_id, version, score)


def _decide(client: Any, name: str, run_id: str, version: str | None, score: float) -> RegisterDecision:
    from mlflow.exceptions import MlflowException

    champion_score: float | None = None
    current: Any = None
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        current = None  # no champion yet
    if current is not None:
        champion_run = client.get_run(current.run_id)
        champion_score = champion_run.data.metrics.get(DECISION_METRIC)
    if version is None:
        promoted, reason = False, "model version was not registered"
    elif not math.isfinite(score):
        promoted, reason = False, "candidate has no backtest score"
    elif current is None:
        promoted, reason = True, "no champion yet"
    elif champion_score is None or score > champion_score:
        promoted = True
        reason = f"{DECISION_METRIC} {score:.4f} beats champion v{current.version} ({champion_score})"
    else:
        promoted = False
        reason = (
            f"{DECISION_METRIC} {score:.4f} does not beat champion v{current.version} ({champion_score:.4f})"
        )
    if promoted:
        client.set_registered_model_alias(name, CHAMPION, version)
    client.set_tag(run_id, "prewarm.champion_decision", ("promoted: " if promoted else "kept: ") + reason)
    log.info(
        "forecaster champion decision",
        extra={"promoted": promoted, "reason": reason, "run_id": run_id, "version": version},
    )
    return RegisterDecision(run_id, version, promoted, reason, score, champion_score)


def load_forecaster(uri: str | Path, *, tracking_uri: str | None = None) -> ForecasterBundle:
    """A bundle from a local directory, or from MLflow (``models:/NAME@ALIAS``, ``models:/NAME/3``,
    ``runs:/RUN/forecaster``): the logged model is downloaded and its JSON bundle read."""
    text = str(uri)
    if "://" not in text and not text.startswith(("models:/", "runs:/")):
        return ForecasterBundle.load(text)
    import mlflow

    with (
        _mlflow_errors(f"load {text}"),
        tempfile.TemporaryDirectory() as tmp,
        _tracking(tracking_uri or mlflow.get_tracking_uri()),
    ):
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=text, dst_path=tmp))
        candidates = [local / "artifacts" / "bundle", local / "bundle", local]
        for candidate in candidates:
            if (candidate / "bundle.json").exists():
                return ForecasterBundle.load(candidate)
        raise ForecastError(f"{text}: no forecaster bundle in the downloaded model")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
