"""``prewarm produce``: Produce request-log events to Kafka: synthetic traffic or a trace replay."""

from __future__ import annotations

from prewarm.cli._common import app_group

app = app_group("Produce request-log events to Kafka: synthetic traffic or a trace replay.")
