"""prewarm: predictive model prefetch for multi-model inference platforms.

The spine every other package builds on: settings, wire schemas, the exception tree, model ids, units,
logging and metrics, the registry of URI schemes a catalog accepts, and the order semantics (admission,
what an order does to a node's copies, LRU victims) that the planner, the executor and the simulator
share. It imports none of the other packages. Metrics: ``counter``, ``gauge`` and ``histogram`` get or
create a collector in the process's one ``REGISTRY``; ``render_metrics`` is its text for ``/metrics``;
``model_label`` keeps a metric's model labels to the first few models (``TopLabels``; the rest are
``OTHER_MODELS``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from prewarm._busy import BusyShare
from prewarm._exceptions import (
    AccessDenied,
    BrokerError,
    CapacityError,
    ConfigError,
    Forbidden,
    ForecastError,
    IntegrityError,
    InvalidEvent,
    InvalidHint,
    InvalidInput,
    InvalidWeights,
    ObjectStoreError,
    PlacementFailed,
    PrewarmError,
    ServiceError,
    StorageError,
    TrackingError,
    Unauthorized,
    UnknownModel,
)
from prewarm._ids import MAX_MODEL_ID_LENGTH, ModelId, validate_model_id
from prewarm._logging import configure_logging, get_logger
from prewarm._metrics import OTHER_MODELS, REGISTRY, TopLabels, counter, gauge, histogram, model_label
from prewarm._metrics import render as render_metrics
from prewarm._orders import (
    Admission,
    Effect,
    Evictable,
    Holding,
    UseCounts,
    Versioned,
    admit,
    admits,
    closest,
    effect,
    gpu_placement,
    gpu_shards,
    load_path,
    lru_victims,
    weighed,
)
from prewarm._schemas import (
    CACHE_TIERS,
    DEMAND_SOURCE,
    EVENT_MAX_BYTES,
    HOP_INTO,
    ExecutorState,
    GpuState,
    Hint,
    Order,
    OrderAction,
    OrderOutcome,
    OrderReason,
    OrderStatus,
    RequestEvent,
    ResidentModel,
    Tier,
    TierState,
    parse_request_event,
)
from prewarm._schemes import known_schemes, register_scheme
from prewarm._settings import (
    CoreSettings,
    ExecutorSettings,
    ForecastSettings,
    IngestSettings,
    KafkaSettings,
    S3Settings,
    SchedulerSettings,
    Settings,
    StoreSettings,
    load_settings,
    parse_overrides,
)
from prewarm._times import MAX_EPOCH_S, epoch_seconds, not_epoch_seconds
from prewarm._units import ByteRate, Bytes, format_bytes, parse_byte_rate, parse_bytes

try:
    __version__ = version("prewarm")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = [
    "CACHE_TIERS",
    "DEMAND_SOURCE",
    "EVENT_MAX_BYTES",
    "HOP_INTO",
    "MAX_EPOCH_S",
    "MAX_MODEL_ID_LENGTH",
    "OTHER_MODELS",
    "REGISTRY",
    "AccessDenied",
    "Admission",
    "BrokerError",
    "BusyShare",
    "ByteRate",
    "Bytes",
    "CapacityError",
    "ConfigError",
    "CoreSettings",
    "Effect",
    "Evictable",
    "ExecutorSettings",
    "ExecutorState",
    "Forbidden",
    "ForecastError",
    "ForecastSettings",
    "GpuState",
    "Hint",
    "Holding",
    "IngestSettings",
    "IntegrityError",
    "InvalidEvent",
    "InvalidHint",
    "InvalidInput",
    "InvalidWeights",
    "KafkaSettings",
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
    "TopLabels",
    "TrackingError",
    "Unauthorized",
    "UnknownModel",
    "UseCounts",
    "Versioned",
    "__version__",
    "admit",
    "admits",
    "closest",
    "configure_logging",
    "counter",
    "effect",
    "epoch_seconds",
    "format_bytes",
    "gauge",
    "get_logger",
    "gpu_placement",
    "gpu_shards",
    "histogram",
    "known_schemes",
    "load_path",
    "load_settings",
    "lru_victims",
    "model_label",
    "not_epoch_seconds",
    "parse_byte_rate",
    "parse_bytes",
    "parse_overrides",
    "parse_request_event",
    "register_scheme",
    "render_metrics",
    "validate_model_id",
    "weighed",
]
