"""``prewarm executor``: The GPU-node executor: load weights through L3 -> L2 -> L1 -> L0, verify caches, report state."""

from __future__ import annotations

from prewarm.cli._common import app_group

app = app_group(
    "The GPU-node executor: load weights through L3 -> L2 -> L1 -> L0, verify caches, report state."
)
