"""Fixtures for forecaster tests."""

from __future__ import annotations

import numpy as np
import pytest

from forecaster import History
from ingest._synthetic import generate


@pytest.fixture(scope="session")
def synthetic_small() -> tuple[History, dict[str, str]]:
    """21 models (three of each pattern family), 14 days."""
    trace = generate(21, 14, seed=7)
    return History(trace.models, int(trace.start), trace.counts.astype(np.float64)), trace.families
