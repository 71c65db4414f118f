"""The observability tests build small real executors with the executor tests' kit (as tests/handoff do)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "executor"))
