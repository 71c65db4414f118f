"""MLflow at the boundary: log a retrain, register it, move ``champion`` only when it is better, load back.

Everything goes through one ``MlflowClient`` made for the server at hand (``tracking_client``), never
through MLflow's fluent API (``mlflow.set_tracking_uri``, ``set_experiment``, ``start_run``,
``log_model`` ...): that API keeps the server, the experiment and the active run in process-global state
and writes ``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_ID`` into the environment, which a retrain in
the scheduler's job thread must not share with the rest of the process. Where MLflow's helpers resolve a
``models:/`` URI or log a model only through that global state, this module does the same steps with the
client (``_log_model``, ``_artifact_location``).

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
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pandas as pd

from forecaster._backtest import BacktestReport
from forecaster._bundle import ForecasterBundle
from prewarm import ForecastError, TrackingError, get_logger

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = [
    "CHAMPION",
    "RegisterDecision",
    "champion_version",
    "load_forecaster",
    "log_retrain",
    "tracking_client",
]

log = get_logger(__name__)
CHAMPION = "champion"
# The metric a candidate must beat the champion on. Skill is relative to each run's own constant-rate
# baseline, which keeps runs trained on different weeks comparable; raw Brier would not be.
DECISION_METRIC = "agg.brier_skill"
_MODEL_NAME = "forecaster"
_PYFUNC_CODE = Path(__file__).with_name("_pyfunc_model.py")

# MLflow 3 opens a file store (the embedded default ``mlruns`` under ``data_dir``, and the tests' stores)
# only when this variable allows it, and has no per-client switch. It is set once, when the forecaster
# is imported and before any thread talks to MLflow, never around calls; an operator's own value stands.
# Nothing else is needed from the environment here: the tracking server proxies artifacts
# (``mlflow-artifacts:``), and an S3 artifact store reached directly reads ``MLFLOW_S3_ENDPOINT_URL``
# and the ``AWS_*`` credentials from the deployment's environment (MLflow offers no per-client way).
os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def tracking_client(tracking_uri: str) -> MlflowClient:
    """A client for one MLflow server, which holds both the runs and the model registry."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


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


def log_retrain(
    client: MlflowClient,
    bundle: ForecasterBundle,
    report: BacktestReport | None,
    *,
    experiment: str,
    registered_model: str,
    params: dict[str, Any],
    now: float,
    plots: list[Path] | None = None,
) -> RegisterDecision:
    """Log one retrain as a run, register its model, and promote it to ``champion`` if it is better."""
    from mlflow.tracking.context.registry import resolve_tags

    aggregate = report.aggregate if report is not None else {}
    tags = {
        "prewarm.kind": "forecaster-retrain",
        "prewarm.now": str(now),
        "prewarm.models": str(len(bundle.models)),
    }
    with _mlflow_errors(f"log retrain to {experiment!r}"):
        experiment_id = _experiment_id(client, experiment)
        # resolve_tags adds what a fluent run records of where it came from (user, source).
        run = client.create_run(experiment_id, run_name=f"retrain-{int(now)}", tags=resolve_tags(tags))
        run_id = run.info.run_id
        try:
            with tempfile.TemporaryDirectory() as tmp:
                version = _log_run(
                    client, run_id, experiment_id, bundle, report, params, registered_model, Path(tmp), plots
                )
        except BaseException:
            # Best effort: the run is marked failed, but the caller hears of what went wrong first.
            with contextlib.suppress(Exception):
                client.set_terminated(run_id, "FAILED")
            raise
        client.set_terminated(run_id, "FINISHED")
        score = float(aggregate.get("brier_skill", float("nan")))
        return _decide(client, registered_model, run_id, version, score)


def _experiment_id(client: MlflowClient, name: str) -> str:
    """The id of the experiment called ``name``, created if it does not exist yet."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return str(client.create_experiment(name))
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)  # another retrain created it meanwhile
            if experiment is None:
                raise
    if experiment.lifecycle_stage != "active":
        raise TrackingError(f"MLflow experiment {name!r} is deleted: restore it or configure another")
    return str(experiment.experiment_id)


def _log_run(
    client: MlflowClient,
    run_id: str,
    experiment_id: str,
    bundle: ForecasterBundle,
    report: BacktestReport | None,
    params: dict[str, Any],
    registered_model: str,
    tmp: Path,
    plots: list[Path] | None,
) -> str:
    """Params, artifacts, the registered model and metrics of one retrain run; the model's version."""
    from mlflow.entities import Metric, Param

    texts = {k: str(v)[:500] for k, v in params.items()}
    client.log_batch(run_id, params=[Param(k, v) for k, v in texts.items()])
    aggregate = report.aggregate if report is not None else {}
    metrics = {f"agg.{k}": float(v) for k, v in aggregate.items() if _is_number(v)}
    for pattern, values in (aggregate.get("by_pattern") or {}).items():
        metrics.update({f"pattern.{pattern}.{k}": float(v) for k, v in values.items() if _is_number(v)})
    metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
    bundle_dir = bundle.save(tmp / "bundle")
    client.log_artifacts(run_id, str(bundle_dir), artifact_path="params")
    if report is not None:
        (tmp / "backtest.json").write_text(json.dumps(report.to_json(), indent=1, default=str))
        client.log_artifact(run_id, str(tmp / "backtest.json"), artifact_path="backtest")
        # Each model's scores as one table, not as metrics: four a model made 40,000 metrics a run at
        # 10,000 models (a file each in a file store, a row each in a database, unreadable in the UI).
        _per_model_table(report).to_csv(tmp / "per_model.csv", index=False)
        client.log_artifact(run_id, str(tmp / "per_model.csv"), artifact_path="backtest")
    for plot in plots or []:
        client.log_artifact(run_id, str(plot), artifact_path="backtest")
    version = _log_model(client, run_id, experiment_id, bundle, bundle_dir, texts, registered_model, tmp)
    # Metrics go in after the model, as they did when MLflow's log_model linked every metric already on
    # the run to the logged model, one history lookup each (minutes for 4000 per-model metrics).
    if metrics:
        stamp = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(k, v, stamp, 0) for k, v in metrics.items()])
    return version


PER_MODEL_COLUMNS = (
    "family_chosen",
    "pattern",
    "brier",
    "brier_baseline",
    "brier_time_of_week",
    "brier_skill",
    "poisson_deviance",
    "poisson_deviance_baseline",
)
"""The columns of a retrain run's ``backtest/per_model.csv``, after ``model``."""


def _per_model_table(report: BacktestReport) -> pd.DataFrame:
    """One row a model of the backtest's scores (``PER_MODEL_COLUMNS``)."""
    rows = [{"model": m, **{k: v.get(k) for k in PER_MODEL_COLUMNS}} for m, v in report.per_model.items()]
    return pd.DataFrame(rows, columns=["model", *PER_MODEL_COLUMNS])


def _log_model(
    client: MlflowClient,
    run_id: str,
    experiment_id: str,
    bundle: ForecasterBundle,
    bundle_dir: Path,
    params: dict[str, str],
    registered_model: str,
    tmp: Path,
) -> str:
    """What ``mlflow.pyfunc.log_model(..., registered_model_name=...)`` does, through ``client``.

    A logged model of the run (MLflow 3's own kind of entity, ``models:/<id>``) gets the saved pyfunc
    as its artifacts and is registered as a new version of ``registered_model``; returns that version.
    """
    import mlflow
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model
    from mlflow.tracking.context.registry import resolve_tags

    logged = client.create_logged_model(
        experiment_id, name=_MODEL_NAME, source_run_id=run_id, tags=resolve_tags(), params=params
    )
    example = pd.DataFrame({"now": [float(bundle.trained_until)], "horizon_s": [600]})
    try:
        client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
        local = tmp / "model"
        mlflow.pyfunc.save_model(
            path=str(local),
            mlflow_model=Model(
                artifact_path=logged.artifact_location,
                model_uuid=logged.model_id,
                run_id=run_id,
                model_id=logged.model_id,
            ),
            python_model=str(_PYFUNC_CODE),
            artifacts={"bundle": str(bundle_dir)},
            pip_requirements=[f"mlflow=={mlflow.__version__}", "numpy", "pandas"],
            signature=_signature(),
            # A one-row example documents the call; the saved model must answer it before it is logged.
            input_example=example,
        )
        _check_answers(local, example)
        for cache in local.rglob("__pycache__"):  # left by loading the model code to check it
            shutil.rmtree(cache, ignore_errors=True)
        client.log_model_artifacts(logged.model_id, str(local))
    except BaseException:
        with contextlib.suppress(Exception):
            client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
        raise
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    return _register(client, registered_model, logged.model_id, run_id)


def _check_answers(local: Path, example: pd.DataFrame) -> None:
    """Load the saved pyfunc and answer ``example``, then let go of the bundle it loaded.

    MLflow keeps the last model loaded from code in a module global (``__mlflow_model__``) until the next
    such load: left there, the checked copy of every model's tables (40 kB a model) would outlive the
    check in a retrain's driver, on top of the bundle it returns."""
    import mlflow

    checked = mlflow.pyfunc.load_model(str(local))
    checked.predict(example)
    python_model: Any = checked.unwrap_python_model()
    del python_model.bundle


def _register(client: MlflowClient, name: str, model_id: str, run_id: str) -> str:
    """A new version of the registered model ``name`` (created on first use) for a logged model."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code not in {"RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"}:
            raise
    source = f"models:/{model_id}"
    if urlparse(client.tracking_uri).scheme not in {"http", "https", "databricks"}:
        # An in-process registry store (file, SQLite) looks a ``models:/`` source up through MLflow's
        # process-wide client, which may point at another server (MLflow's own TODO); its artifact
        # location downloads the same files. A server resolves ``models:/`` itself and keeps the link.
        source = client.get_logged_model(model_id).artifact_location
    version = client.create_model_version(name, source, run_id=run_id, model_id=model_id)
    # The link from the logged model to its registered version that MLflow's UI shows.
    link = [{"name": version.name, "version": version.version}]
    client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(link)})
    return str(version.version)


def _decide(client: MlflowClient, name: str, run_id: str, version: str, score: float) -> RegisterDecision:
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
    if not math.isfinite(score):
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


def champion_version(registered_model: str, *, tracking_uri: str) -> str | None:
    """The registry version the ``champion`` alias of ``registered_model`` points to now; None while
    there is none (no such model, or no alias yet). One registry call: cheap enough for a scheduler to
    ask on every tick and so pick up a promotion made by hand or by another retrain."""
    from mlflow.exceptions import MlflowException

    client = tracking_client(tracking_uri)
    with _mlflow_errors(f"read {registered_model}@{CHAMPION}"):
        try:
            return str(client.get_model_version_by_alias(registered_model, CHAMPION).version)
        except MlflowException as exc:
            if getattr(exc, "error_code", "") in {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"}:
                return None
            raise


def load_forecaster(uri: str | Path, *, tracking_uri: str | None = None) -> ForecasterBundle:
    """A bundle from a local directory, or from MLflow (``models:/NAME@ALIAS``, ``models:/NAME/3``,
    ``runs:/RUN/forecaster``): the logged model is downloaded and its JSON bundle read.

    ``tracking_uri`` defaults to MLflow's own default (``MLFLOW_TRACKING_URI``, else ``./mlruns``)."""
    text = str(uri)
    if "://" not in text and not text.startswith(("models:/", "runs:/")):
        return ForecasterBundle.load(text)
    import mlflow

    server = tracking_uri or mlflow.get_tracking_uri()
    with _mlflow_errors(f"load {text}"), tempfile.TemporaryDirectory() as tmp:
        location = _artifact_location(tracking_client(server), text)
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=location, dst_path=tmp, tracking_uri=server, registry_uri=server
            )
        )
        candidates = [local / "artifacts" / "bundle", local / "bundle", local]
        for candidate in candidates:
            if (candidate / "bundle.json").exists():
                return ForecasterBundle.load(candidate)
        raise ForecastError(f"{text}: no forecaster bundle in the downloaded model")


def _artifact_location(client: MlflowClient, uri: str) -> str:
    """Where the files of a ``models:/`` or ``runs:/`` URI are, asked of ``client``.

    MLflow's own download resolves these through the process-wide tracking and registry URIs, which
    may name another server than the one asked for; other URIs are passed through as they are.
    """
    from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository
    from mlflow.store.artifact.utils.models import get_model_name_and_version

    if uri.startswith("runs:/"):
        run_id, _, path = uri[len("runs:/") :].partition("/")
        name, _, inside = path.partition("/")
        run = client.get_run(run_id)
        # A model the run logged (MLflow 3 keeps it apart from the run's own artifacts), else a file.
        found = client.search_logged_models(
            [run.info.experiment_id], filter_string=f"name = '{name}' AND source_run_id = '{run_id}'"
        )
        if found:
            return _join(found[0].artifact_location, inside)
        return _join(run.info.artifact_uri, path)
    if not uri.startswith("models:/"):
        return uri
    model, inside = ModelsArtifactRepository.split_models_uri(uri)  # type: ignore[no-untyped-call]
    named = get_model_name_and_version(client, model)  # type: ignore[no-untyped-call]
    if len(named) == 1:  # models:/<logged model id>
        return _join(client.get_logged_model(named[0]).artifact_location, inside)
    return _join(client.get_model_version_download_uri(*named), inside)


def _join(location: str, inside: str) -> str:
    return f"{location.rstrip('/')}/{inside}" if inside else location


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
