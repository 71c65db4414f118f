"""ingest: gateway request logs from Kafka into exactly-once per-model, per-minute demand.

Write side: ``IngestConsumer`` (one member of the consumer group; counts, counters and offsets commit
in one transaction of the ``DemandStore``), ``DeadLetterWriter`` for events it cannot count, and
``RequestLogProducer`` for gateways and replays (``replay_frame`` with ``read_trace`` or the synthetic
``generate``).

Read side, for the forecaster and the scheduler: ``DemandStore(url)`` with ``series``, ``bulk``,
``models_seen`` and ``last_request``. Upkeep: ``DemandStore.maintain`` / ``roll_up`` (minutes past the
retention window become hourly rows, a ``RollupResult``) and ``migrate``.

For operators: ``ingest_stats`` (a group's counters, offsets and ``consumer_lag``), the throughput
benchmarks ``run_ingest_bench`` (``prewarm bench ingest``) and ``run_group_bench`` (``--consumers``),
and ``run_store_size_bench`` (``prewarm bench store``, with ``minute_counts`` of the generator).
"""

from __future__ import annotations

from ingest._bench import BenchConfig, run_ingest_bench
from ingest._consumer import IngestConsumer, IngestSummary
from ingest._dlq import DeadLetter, DeadLetterWriter, decode_dead_letter
from ingest._groupbench import run_group_bench
from ingest._producer import RequestLogProducer, encode_event
from ingest._replay import ReplayResult, replay_frame
from ingest._retention import RollupResult
from ingest._sizebench import run_store_size_bench
from ingest._stats import IngestStats, consumer_lag, ingest_stats
from ingest._store import DemandStore, OffsetConflict, OffsetUpdate, StoredOffset
from ingest._synthetic import FAMILIES, SyntheticTrace, generate, minute_counts
from ingest._traces import TRACE_FORMATS, TraceFormat, azure2019_minute_counts, azure_model_id, read_trace
from ingest._window import Cell, MinuteAggregator, Verdict, WindowPolicy, aggregate, minute_of

__all__ = [
    "FAMILIES",
    "TRACE_FORMATS",
    "BenchConfig",
    "Cell",
    "DeadLetter",
    "DeadLetterWriter",
    "DemandStore",
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
]
