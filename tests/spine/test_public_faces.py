"""Each package's public face is small and deliberate: pinned here, so a change to it is a decision."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PINNED = {
    "executor": [
        "DEFAULT_EXCLUDES",
        "Executor",
        "ExecutorDaemon",
        "FileStore",
        "HandoffServer",
        "HostLease",
        "Layout",
        "LoadResult",
        "ObjectStore",
        "Registration",
        "S3Store",
        "TensorEntry",
        "VerifyResult",
        "describe_entry",
        "open_store",
        "parse_header",
        "register_store",
        "run_forever",
        "run_handoff_benchmark",
        "run_load_benchmark",
        "tensor_views",
    ],
    "forecaster": [
        "BUNDLE_VERSION",
        "BacktestReport",
        "CHAMPION",
        "Choice",
        "FAMILIES",
        "Family",
        "Engine",
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
    ],
    "ingest": [
        "BenchConfig",
        "Cell",
        "DeadLetter",
        "DeadLetterWriter",
        "DemandStore",
        "FAMILIES",
        "TRACE_FORMATS",
        "IngestConsumer",
        "IngestStats",
        "IngestSummary",
        "MinuteAggregator",
        "OffsetConflict",
        "OffsetUpdate",
        "ReplayResult",
        "RequestLogProducer",
        "RollupResult",
        "StoredOffset",
        "SyntheticTrace",
        "TraceFormat",
        "Verdict",
        "WindowPolicy",
        "aggregate",
        "azure2019_minute_counts",
        "azure_model_id",
        "consumer_lag",
        "decode_dead_letter",
        "encode_event",
        "generate",
        "ingest_stats",
        "minute_counts",
        "minute_of",
        "read_trace",
        "replay_frame",
        "run_group_bench",
        "run_ingest_bench",
        "run_store_size_bench",
    ],
    "models": [
        "CATALOG_VERSION",
        "INDEX_FILE",
        "LLAMA_TINY",
        "Catalog",
        "CatalogProblem",
        "CatalogWatcher",
        "FileSpec",
        "ModelSpec",
        "PriorityClass",
        "TransformerShape",
        "index_problems",
        "manifest_sha256",
        "parse_entry",
        "shape_for_size",
        "synth_catalog",
        "synth_checkpoint",
        "write_safetensors",
    ],
    "prewarm": [
        "Admission",
        "Effect",
        "Evictable",
        "Holding",
        "Versioned",
        "abridged",
        "admit",
        "admits",
        "closest",
        "effect",
        "epoch_seconds",
        "gpu_placement",
        "gpu_shards",
        "held_recency",
        "iso_utc",
        "load_path",
        "lru_victims",
        "not_epoch_seconds",
        "BusyShare",
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
        "GpuState",
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
        "MAX_EPOCH_S",
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
        "OTHER_MODELS",
        "REGISTRY",
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
        "TopLabels",
        "TrackingError",
        "Unauthorized",
        "UnknownModel",
        "UseCounts",
        "__version__",
        "configure_logging",
        "counter",
        "model_label",
        "format_bytes",
        "gauge",
        "get_logger",
        "known_schemes",
        "histogram",
        "load_settings",
        "parse_byte_rate",
        "parse_bytes",
        "parse_overrides",
        "parse_request_event",
        "register_scheme",
        "render_metrics",
        "validate_model_id",
        "weighed",
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
        "PlannerMemo",
        "Runtime",
        "SchedulerCore",
        "bench_hints",
        "bench_plan",
        "create_app",
        "order_id",
        "plan",
        "plan_detailed",
    ],
    "prewarm_cli": ["app", "main"],
    "prewarm_client": [
        "ENV_SOCKET_DIR",
        "PROTOCOL_VERSION",
        "SOCKET_NAME",
        "BlockLayout",
        "CudaIpcHandle",
        "DeviceShard",
        "ExecutorUnavailable",
        "FileSlice",
        "HandoffError",
        "OpenRequest",
        "ProtocolError",
        "Refused",
        "TableEntry",
        "TensorTable",
        "Weights",
        "checkpoint_files",
        "default_socket_dir",
        "iter_weights",
        "open_weights",
        "recv_message",
        "send_message",
    ],
    "sim": [
        "Case",
        "CompileError",
        "compile_dir",
        "compile_run_loop",
        "is_compiled",
        "running_compiled",
        "DEFAULT_KNOBS",
        "DEFAULT_POLICIES",
        "DEFAULT_SIZES",
        "HistogramPolicy",
        "IdleHistogram",
        "KeepAlivePolicy",
        "LONG_TAIL_MIX",
        "LongTail",
        "MISPREDICTED_BY",
        "Matched",
        "ModelTruth",
        "NodeShape",
        "OraclePolicy",
        "Policy",
        "PolicyBench",
        "PolicyContext",
        "PolicyFactory",
        "PolicyInputs",
        "PrewarmPolicy",
        "Progress",
        "ReactivePolicy",
        "Requests",
        "SETTINGS",
        "SUITE_CASES",
        "SimMetrics",
        "SweepPoint",
        "SweepResult",
        "Target",
        "UNLIMITED_NODE",
        "UnlimitedWorld",
        "WARMUP_S",
        "Windows",
        "World",
        "available",
        "compare",
        "default_cluster",
        "dominated",
        "fit_forecasts",
        "judge",
        "knob_float",
        "label_grid",
        "long_tail",
        "make_policy",
        "make_world",
        "metrics",
        "order_for",
        "pareto_front",
        "poisson_idle_bound",
        "policy_kinds",
        "read_hints",
        "register_policy",
        "roomy_cluster",
        "run_policies",
        "run_policy_bench",
        "simulate",
        "suite",
        "sweep",
        "virtual_catalog",
        "write_case",
    ],
}


@pytest.mark.parametrize("package", sorted(PINNED))
def test_public_api_is_pinned(package: str) -> None:
    assert sorted(importlib.import_module(package).__all__) == sorted(PINNED[package])


@pytest.mark.parametrize(
    "package",
    [
        "prewarm",
        "models",
        "ingest",
        "forecaster",
        "scheduler",
        "executor",
        "sim",
        "prewarm_cli",
        "prewarm_client",
    ],
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
        {"models", "ingest", "forecaster", "scheduler", "executor", "sim", "prewarm_cli", "torch", "pandas"},
    ),
    # A GPU node never loads the control plane; boto3 only when an s3:// store is opened.
    "executor": (
        "import executor, executor._executor, prewarm_cli._executor",
        {"pandas", "statsmodels", "mlflow", "sqlalchemy", "sklearn", "boto3"},
    ),
    # An engine process needs the client only: nothing of ours, no service library, not even the spine's
    # pydantic and yaml (and the vLLM plugin module imports vLLM only when vLLM calls it).
    "prewarm_client": (
        "import prewarm_client, prewarm_client.vllm",
        {
            "prewarm",
            "models",
            "executor",
            "pydantic",
            "yaml",
            "fastapi",
            "kafka",
            "boto3",
            "vllm",
            "transformers",
        },
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


REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("models", "ingest", "forecaster", "scheduler", "executor", "sim", "prewarm_cli")


def _imports(package: str) -> list[tuple[str, str]]:
    """(file, imported module) for every import statement in ``package``, inside functions too."""
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path.name, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found += [(path.name, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_the_spine_imports_none_of_the_other_packages() -> None:
    assert [(f, m) for f, m in _imports("prewarm") if m.split(".")[0] in PACKAGES] == []


def test_the_cli_imports_only_public_faces() -> None:
    """``from ingest import X`` with X in its ``__all__``; never ``ingest._kafka``, ``executor.daemon``."""
    faces = {"prewarm", *PACKAGES} - {"prewarm_cli"}
    beyond_faces = [
        (file, module)
        for file, module in _imports("prewarm_cli")
        if module.split(".")[0] in faces
        and "." in module
        and module.split(".")[1] not in importlib.import_module(module.split(".")[0]).__all__
    ]
    assert beyond_faces == []
