"""``prewarm forecast``: Train, inspect and backtest the per-model demand forecasters."""

from __future__ import annotations

from prewarm.cli._common import app_group

app = app_group("Train, inspect and backtest the per-model demand forecasters.")
