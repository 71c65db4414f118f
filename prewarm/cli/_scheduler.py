"""``prewarm scheduler``: The scheduler: planning loop, hint API and order publishing."""

from __future__ import annotations

from prewarm.cli._common import app_group

app = app_group("The scheduler: planning loop, hint API and order publishing.")
