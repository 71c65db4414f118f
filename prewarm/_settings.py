"""Typed settings, read once at start-up.

Each component has its own section, a pydantic-settings class with the env prefix ``PREWARM_`` and flat,
globally unique field names (``PREWARM_KAFKA_BOOTSTRAP``, ``PREWARM_TOPIC_REQUESTS`` …). Sources, lowest
to highest priority: defaults, the optional YAML config file (``--config`` or ``PREWARM_CONFIG``; flat
keys, or one mapping per section), environment variables, CLI overrides (``--set key=value``).
Unknown keys in any source are a ``ConfigError`` naming the key; nothing is read from the environment
after ``load_settings`` returns.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from prewarm._exceptions import ConfigError
from prewarm._units import Bytes

__all__ = [
    "CoreSettings",
    "ExecutorSettings",
    "ForecastSettings",
    "IngestSettings",
    "KafkaSettings",
    "S3Settings",
    "SchedulerSettings",
    "Settings",
    "StoreSettings",
    "load_settings",
    "parse_overrides",
]

ENV_PREFIX = "PREWARM_"
# Read by load_settings itself, not a field of any section; or when ``sim`` is imported, before any
# settings exist (sim/_compiled.py: the pure run loop, where its builds live).
_META_KEYS = {"config", "sim_pure", "sim_build"}


def _masked(value: SecretStr) -> str:
    return "***" if value.get_secret_value() else ""


# A secret setting: parsed from the file, the environment or --set like any string, read with
# ``.get_secret_value()``. A JSON dump says only whether it is set ("***" or ""), so printing the
# settings never shows it; repr and str show pydantic's mask.
Secret = Annotated[SecretStr, PlainSerializer(_masked, return_type=str, when_used="json")]


class _Section(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)
    section: ClassVar[str]


class CoreSettings(_Section):
    section = "core"
    catalog: Path | None = Field(default=None, description="catalog YAML; the demo synthesizes one if unset")
    data_dir: Path = Field(
        default=Path(".prewarm"), description="embedded-mode state: SQLite, caches, mlruns"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"


class KafkaSettings(_Section):
    section = "kafka"
    kafka_bootstrap: str = Field(default="127.0.0.1:9092", description="host:port[,host:port]")
    topic_requests: str = "prewarm.requests"
    topic_dlq: str = "prewarm.requests.dlq"
    topic_orders: str = "prewarm.orders"
    topic_executor_state: str = "prewarm.executor-state"
    kafka_client_id: str = "prewarm"
    kafka_check_crcs: bool = Field(
        default=True,
        description="verify record CRC32C on fetch (kafka-python uses the crc32c C extension, a dependency)",
    )
    # What prewarm creates its topics with (a topic that exists already is left as it is). The defaults
    # fit one broker; on three, replication 3 with min.insync 2 survives the loss of any one broker
    # without losing an acknowledged record (every producer sends with acks=all).
    kafka_replication_factor: int = Field(
        default=1, ge=1, le=32, description="replicas of each topic prewarm creates; at most the broker count"
    )
    kafka_min_insync_replicas: int | None = Field(
        default=None,
        ge=1,
        le=32,
        description="min.insync.replicas of those topics; unset = replication factor - 1 (1 at least)",
    )
    topic_requests_partitions: int = Field(
        default=12,
        ge=1,
        le=10_000,
        description="partitions of the request log: how many ingest consumers share it",
    )
    topic_dlq_partitions: int = Field(
        default=1, ge=1, le=10_000, description="partitions of the dead-letter topic"
    )
    topic_control_partitions: int = Field(
        default=1, ge=1, le=10_000, description="partitions of the orders and executor-state topics"
    )

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap(cls, value: str) -> str:
        for server in value.split(","):
            if not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}", server.strip()):
                raise ValueError(f"{server!r} is not host:port")
        return value

    @field_validator("kafka_min_insync_replicas")
    @classmethod
    def _insync_within_replicas(cls, value: int | None, info: ValidationInfo) -> int | None:
        # The broker would accept such a topic and then refuse every acks=all write to it.
        replicas = info.data.get("kafka_replication_factor")
        if value is not None and replicas is not None and value > replicas:
            raise ValueError(f"{value} exceeds kafka_replication_factor ({replicas}): no write could succeed")
        return value

    @property
    def min_insync_replicas(self) -> int:
        """The effective min.insync.replicas: the setting, else one fewer than the replicas (1 at least)."""
        if self.kafka_min_insync_replicas is not None:
            return self.kafka_min_insync_replicas
        return max(self.kafka_replication_factor - 1, 1)


class StoreSettings(_Section):
    section = "store"
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; unset means SQLite under data_dir (WAL mode)"
    )

    @field_validator("database_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z][a-z0-9+]*://.*", value):
            raise ValueError(f"not a SQLAlchemy URL (dialect[+driver]://...): {value!r}")
        return value


class S3Settings(_Section):
    section = "s3"
    s3_endpoint: AnyHttpUrl | None = Field(default=None, description="S3-compatible endpoint; unset = AWS")
    s3_region: str = "us-east-1"
    s3_part_bytes: Bytes = Field(default=32 * 2**20, description="ranged-GET part size")
    s3_concurrency: int = Field(default=8, ge=1, le=128, description="parallel ranged GETs per object")
    s3_max_attempts: int = Field(default=5, ge=1, le=20, description="attempts per part on transient errors")
    s3_connect_timeout_s: float = Field(default=5.0, gt=0, description="TCP connect timeout per request")
    s3_read_timeout_s: float = Field(default=60.0, gt=0, description="socket read timeout per request")


class ExecutorSettings(_Section):
    section = "executor"
    node_name: str = Field(default="node-0", min_length=1, max_length=128)
    cache_dir: Path | None = Field(default=None, description="L2 directory; unset = data_dir/cache")
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$")
    l2_budget_bytes: Bytes = 50 * 10**9
    l1_budget_bytes: Bytes = 8 * 10**9
    l0_budget: float = Field(
        default=0.5, gt=0, description="bytes if > 1, else a fraction of free device memory"
    )
    l0_reserve_bytes: Bytes = Field(default=2 * 10**9, description="left free for the inference engine")
    l0_gpus: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="GPUs whose L0 the executor drives: on CUDA the first N visible (unset = all; "
        "device cuda:N = that one only); on cpu, N virtual GPUs standing in (unset = 1)",
    )
    read_threads: int = Field(default=4, ge=1, le=64)
    chunk_bytes: Bytes = Field(default=32 * 2**20)
    l2_direct_io: bool = Field(
        default=True, description="read and write L2 with O_DIRECT where the filesystem allows it"
    )
    prefetch_ttl_s: float | None = Field(
        default=None,
        gt=0,
        description="a standalone executor's safety net: unused prefetched L1/L0 entries expire after this; "
        "unset = the scheduler's misprediction rule owns them",
    )
    executor_api_host: str = "127.0.0.1"
    executor_api_port: int = Field(default=8081, ge=0, le=65535)
    executor_api_token: Secret = Field(
        default=SecretStr(""), description="bearer token for the load API's writes; required off localhost"
    )
    socket_dir: Path | None = Field(
        default=None, description="hand-off socket directory (0700); unset = no socket, or --socket-dir"
    )


class IngestSettings(_Section):
    section = "ingest"
    consumer_group: str = "prewarm-ingest"
    lateness_s: float = Field(
        default=600.0,
        ge=0,
        description="events this far behind their partition's newest event are on time; "
        "older ones are counted as late corrections of their minute",
    )
    max_lateness_s: float = Field(
        default=86_400.0,
        ge=0,
        description="late events up to this far behind are counted into their minute; "
        "older ones are counted as too late and not stored (never dead-lettered)",
    )
    future_tolerance_s: float = Field(default=300.0, ge=0, description="events further ahead are dead")
    batch_max_events: int = Field(default=20_000, ge=1)
    batch_max_s: float = Field(default=1.0, gt=0)
    ingest_max_poll_records: int = Field(default=10_000, ge=1, description="records per consumer poll")
    ingest_session_timeout_s: float = Field(
        default=10.0, ge=6, le=300, description="consumer group session: a silent member is dropped after it"
    )
    ingest_metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve Prometheus /metrics from `ingest run` on this port"
    )
    ingest_metrics_host: str = Field(
        default="127.0.0.1", description="address of that /metrics server (0.0.0.0 in a pod, to be scraped)"
    )
    minute_retention_days: float = Field(
        default=35.0,
        ge=1,
        description="per-minute demand kept this long (the forecaster's 28-day span and a week more); "
        "older counts are rolled up to hourly",
    )
    rollup_interval_s: float = Field(
        default=3600.0,
        ge=0,
        description="how often `ingest run` rolls old minutes up and makes partitions ahead; "
        "0 = never (run `prewarm ingest rollup` from cron instead)",
    )
    producer_compression: Literal["none", "gzip", "lz4", "zstd"] = Field(
        default="lz4",
        description="request-log producer compression (lz4 and zstd: C extensions; gzip: zlib)",
    )
    producer_linger_ms: int = Field(default=20, ge=0, le=10_000)
    producer_buffer_bytes: Bytes = Field(
        default=32 * 2**20, description="unacknowledged bytes a producer may hold before send() blocks"
    )
    producer_max_block_s: float = Field(
        default=30.0, gt=0, description="how long send() blocks on a full buffer before BrokerError"
    )


class ForecastSettings(_Section):
    section = "forecast"
    bucket_s: int = Field(default=60, ge=1)
    horizon_s: int = Field(default=7200, ge=60)
    lead_minutes: int = Field(default=5, ge=0)
    window_minutes: int = Field(default=10, ge=1)
    history_days: int = Field(default=28, ge=1)
    retrain_cron: str = Field(
        default="0 3 * * *",
        description="crontab (minute hour day month weekday, UTC) of the scheduler's in-process retrain; "
        "empty = none (a CronJob runs `prewarm forecast train` instead: never both)",
    )
    mlflow_experiment: str = "prewarm-forecaster"
    registered_model: str = "prewarm-forecaster"
    mlflow_tracking_uri: str | None = Field(
        default=None, description="MLflow tracking URI; unset = file store under data_dir/mlruns"
    )
    holdout_days: float = Field(default=3.0, gt=0, description="days a retrain backtests on before promoting")
    selection_folds: int = Field(
        default=2, ge=1, le=7, description="rolling-origin folds for family selection"
    )
    selection_fold_days: float = Field(default=1.0, gt=0, description="days each selection fold scores")
    retrain_workers: int = Field(
        default=1,
        ge=1,
        le=512,
        description="retrain fitting processes: 1 = in this process; N = a local Dask pool of N processes",
    )
    engine_address: str | None = Field(
        default=None,
        min_length=1,
        description="Dask scheduler of a running cluster to fit on (tcp://host:8786); overrides workers",
    )
    retrain_chunk_models: int = Field(
        # A 14-day chunk's fit peaks at ~1.8 MB a model over the process's imports (0.44 GB a worker
        # at 100, 0.74 at 250), and at 3,000 models 30 chunks leave two workers a smaller idle tail.
        default=100,
        ge=1,
        description="models per fitting task: the series held at once per process, whatever the total",
    )


class SchedulerSettings(_Section):
    section = "scheduler"
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=0, le=65535)
    hint_tokens: Secret = Field(default=SecretStr(""), description="'source:token,...' or @/path/to/file")
    publishable_tokens: Secret = Field(
        default=SecretStr(""),
        description="'source:token[:model|model...],...' usable from browsers: post hints, never read",
    )
    read_tokens: Secret = Field(
        default=SecretStr(""),
        description="'name:token,...' or @/path/to/file: read the plan, hints and models; post nothing",
    )
    cors_origins: str = Field(default="", description="comma-separated allowed origins")
    hint_rate_per_s: float = Field(default=50.0, gt=0)
    hint_burst: int = Field(default=100, ge=1)
    max_body_bytes: int = Field(default=16 * 1024, ge=256)
    plan_interval_s: float = Field(default=30.0, gt=0)
    misprediction_window_s: float = Field(default=600.0, gt=0)
    miss_penalty: float = Field(
        default=2.0,
        ge=0,
        description="weighted seconds per second of a wasted prefetch (L1/L0 hops; a download as far as "
        "loads on request keep the link busy); 0 = eager",
    )
    memory_price: float = Field(
        default=0.0,
        ge=0,
        description="weighted seconds per GB-minute a copy is held in L1/L0; 0: memory in budget is free",
    )
    contended_memory_price: float = Field(
        default=0.0,
        ge=0,
        description="memory_price of host memory where the executor's LRU gives copies up; 0: none",
    )
    objective: Literal["requests", "models"] = Field(
        default="requests",
        description="whose cold starts count the same: every request's, or every model's (per-model rate)",
    )
    cluster: Path | None = Field(default=None, description="cluster YAML; unset = one node from executor")
    demand_window_s: float = Field(
        default=60.0, gt=0, description="a model requested this recently is wanted now (demand pre-empts)"
    )
    replica_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="this scheduler replica's name in the leader lease; unset = host-pid-random",
    )
    lease_ttl_s: float = Field(
        default=8.0, ge=1, le=300, description="a leader lease not renewed for this long passes to a standby"
    )
    lease_renew_s: float = Field(
        default=2.0, gt=0, description="how often the active replica renews (and a standby tries) the lease"
    )
    hint_poll_s: float = Field(
        default=1.0, gt=0, le=60, description="how often each replica reads hints other replicas stored"
    )

    @model_validator(mode="after")
    def _lease_timing(self) -> SchedulerSettings:
        # Two renewals must fit in a lease, or one slow round trip hands the lease to a standby.
        if self.lease_renew_s * 2 > self.lease_ttl_s:
            raise ValueError(
                f"lease_renew_s ({self.lease_renew_s:g}) must be at most half of lease_ttl_s "
                f"({self.lease_ttl_s:g})"
            )
        return self


_SECTIONS: tuple[type[_Section], ...] = (
    CoreSettings,
    KafkaSettings,
    StoreSettings,
    S3Settings,
    ExecutorSettings,
    IngestSettings,
    ForecastSettings,
    SchedulerSettings,
)
_FIELD_OWNER: dict[str, type[_Section]] = {
    name: section for section in _SECTIONS for name in section.model_fields
}


class Settings(BaseModel):
    """All sections, built once by ``load_settings``."""

    model_config = ConfigDict(frozen=True)

    core: CoreSettings
    kafka: KafkaSettings
    store: StoreSettings
    s3: S3Settings
    executor: ExecutorSettings
    ingest: IngestSettings
    forecast: ForecastSettings
    scheduler: SchedulerSettings

    @property
    def database_url(self) -> str:
        """The demand store URL, defaulting to SQLite under the data directory."""
        if self.store.database_url:
            return self.store.database_url
        return f"sqlite:///{self.core.data_dir / 'prewarm.db'}"

    @property
    def cache_dir(self) -> Path:
        return self.executor.cache_dir or self.core.data_dir / "cache"


_S = TypeVar("_S", bound=_Section)


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}", setting="config") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}", setting="config") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must be a mapping", setting="config")
    flat: dict[str, Any] = {}
    section_names = {s.section for s in _SECTIONS}
    for key, value in loaded.items():
        if key in section_names and isinstance(value, dict):
            flat.update({str(k): v for k, v in value.items()})
        else:
            flat[str(key)] = value
    return flat


def _build(section: type[_S], file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> _S:
    # Environment beats the file, CLI overrides beat the environment: read the environment alone
    # first to learn which fields it set, then layer the three.
    try:
        from_env = section()
        env_set = {name: getattr(from_env, name) for name in from_env.model_fields_set}
        merged = {**file_values, **env_set, **overrides}
        return section.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else section.section
        name = f"{ENV_PREFIX}{field.upper()}"
        raise ConfigError(f"invalid setting {name}: {err['msg']}", setting=name) from exc


def load_settings(
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build every section from defaults, the config file, the environment and CLI overrides."""
    env = os.environ
    for key in env:
        if key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX) :].lower()
            if name not in _FIELD_OWNER and name not in _META_KEYS:
                raise ConfigError(f"unknown setting {key}", setting=key)
    if config_file is None and env.get(f"{ENV_PREFIX}CONFIG"):
        config_file = Path(env[f"{ENV_PREFIX}CONFIG"])
    file_values = _read_config_file(config_file) if config_file else {}
    overrides = dict(overrides or {})
    for source, values in (("config file", file_values), ("override", overrides)):
        for key in values:
            if key not in _FIELD_OWNER:
                raise ConfigError(f"unknown setting {key!r} in {source}", setting=key)

    def pick(values: Mapping[str, Any], section: type[_Section]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if _FIELD_OWNER[k] is section}

    built = {
        section.section: _build(section, pick(file_values, section), pick(overrides, section))
        for section in _SECTIONS
    }
    return Settings.model_validate(built)


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``["kafka_bootstrap=host:9092"]`` → ``{"kafka_bootstrap": "host:9092"}``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().lower().removeprefix(ENV_PREFIX.lower())
        if not sep or not key:
            raise ConfigError(f"override {pair!r} must be KEY=VALUE", setting=pair)
        out[key] = value
    return out
