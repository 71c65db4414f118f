"""Each package's public face is small and deliberate: pinned here, so a change to it is a decision."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PINNED = {
    "executor": [
        "Executor",
        "FileStore",
        "Layout",
        "LoadResult",
        "ObjectStore",
        "S3Store",
        "TensorEntry",
        "VerifyResult",
        "open_store",
        "parse_header",
        "register_store",
        "tensor_views",
    ],
    "forecaster": [
        "BUNDLE_VERSION",
        "BacktestReport",
        "CHAMPION",
        "Choice",
        "FAMILIES",
        "Family",
        "ForecasterBundle",
        "History",
        "ModelForecast",
        "RegisterDecision",
        "RetrainResult",
        "SelectionConfig",
        "backtest",
        "fit_bundle",
        "load_forecaster",
        "recent_rate_forecasts",
        "retrain",
        "tracking_uri_of",
    ],
    "ingest": [
        "Cell",
        "DeadLetter",
        "DeadLetterWriter",
        "DemandStore",
        "FAMILIES",
        "IngestConsumer",
        "IngestSummary",
        "MinuteAggregator",
        "OffsetConflict",
        "OffsetUpdate",
        "ReplayResult",
        "RequestLogProducer",
        "StoredOffset",
        "SyntheticTrace",
        "Verdict",
        "WindowPolicy",
        "aggregate",
        "azure2019_minute_counts",
        "azure_model_id",
        "decode_dead_letter",
        "encode_event",
        "generate",
        "minute_of",
        "read_trace",
        "replay_frame",
    ],
    "models": [
        "CATALOG_VERSION",
        "Catalog",
        "CatalogProblem",
        "CatalogWatcher",
        "ModelSpec",
        "PriorityClass",
        "SUPPORTED_SCHEMES",
        "TransformerShape",
        "shape_for_size",
        "synth_catalog",
        "write_safetensors",
    ],
    "prewarm": [
        "AccessDenied",
        "BrokerError",
        "ByteRate",
        "Bytes",
        "CACHE_TIERS",
        "CapacityError",
        "ConfigError",
        "CoreSettings",
        "DEMAND_SOURCE",
        "EVENT_MAX_BYTES",
        "ExecutorSettings",
        "ExecutorState",
        "Forbidden",
        "ForecastError",
        "ForecastSettings",
        "HOP_INTO",
        "Hint",
        "IngestSettings",
        "IntegrityError",
        "InvalidEvent",
        "InvalidHint",
        "InvalidInput",
        "InvalidWeights",
        "KafkaSettings",
        "MAX_MODEL_ID_LENGTH",
        "ModelId",
        "ObjectStoreError",
        "Order",
        "OrderAction",
        "OrderOutcome",
        "OrderReason",
        "OrderStatus",
        "PlacementFailed",
        "PrewarmError",
        "RequestEvent",
        "ResidentModel",
        "S3Settings",
        "SchedulerSettings",
        "ServiceError",
        "Settings",
        "StorageError",
        "StoreSettings",
        "Tier",
        "TierState",
        "TrackingError",
        "Unauthorized",
        "UnknownModel",
        "__version__",
        "configure_logging",
        "counter",
        "format_bytes",
        "gauge",
        "get_logger",
        "histogram",
        "load_settings",
        "parse_byte_rate",
        "parse_bytes",
        "parse_overrides",
        "parse_request_event",
        "render_metrics",
        "validate_model_id",
    ],
    "scheduler": [
        "Cluster",
        "ClusterState",
        "DEMAND_SOURCE",
        "NodeSpec",
        "NodeState",
        "Placement",
        "Plan",
        "PlannerConfig",
        "Runtime",
        "SchedulerCore",
        "create_app",
        "order_id",
        "plan",
        "plan_detailed",
    ],
    "sim": [
        "DEFAULT_SIZES",
        "POLICIES",
        "Policy",
        "PrewarmPolicy",
        "ReactivePolicy",
        "Served",
        "SimNode",
        "SimReport",
        "World",
        "compare",
        "default_cluster",
        "run_policies",
        "simulate",
        "virtual_catalog",
    ],
}


@pytest.mark.parametrize("package", sorted(PINNED))
def test_public_api_is_pinned(package: str) -> None:
    assert sorted(importlib.import_module(package).__all__) == sorted(PINNED[package])


@pytest.mark.parametrize(
    "package", ["prewarm", "models", "ingest", "forecaster", "scheduler", "executor", "sim"]
)
def test_every_public_name_exists(package: str) -> None:
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


# What importing a package must not pull in, and why.
LIGHT = {
    # The spine is imported by everything: it imports none of the packages, nor torch or pandas.
    "prewarm": (
        "import prewarm",
        {"models", "ingest", "forecaster", "scheduler", "executor", "sim", "torch", "pandas"},
    ),
    # A GPU node never loads the control plane; boto3 only when an s3:// store is opened.
    "executor": (
        "import executor, executor._executor, prewarm.cli._executor",
        {"pandas", "statsmodels", "mlflow", "sqlalchemy", "sklearn", "boto3"},
    ),
    # The planner alone loads no web or broker library.
    "scheduler": ("import scheduler", {"fastapi", "apscheduler", "kafka"}),
}


@pytest.mark.parametrize("package", sorted(LIGHT))
def test_importing_a_package_leaves_out_what_it_does_not_need(package: str) -> None:
    statement, heavy = LIGHT[package]
    code = f"import sys; {statement}; print(sorted(m for m in {sorted(heavy)!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
