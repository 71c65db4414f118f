"""``prewarm ingest``: Ingest gateway request logs from Kafka into per-model per-minute demand."""

from __future__ import annotations

from prewarm.cli._common import app_group

app = app_group("Ingest gateway request logs from Kafka into per-model per-minute demand.")
