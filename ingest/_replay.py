"""Replay a frame of ``timestamp, model`` rows (a trace or synthetic load) onto the request-log topic.

``speedup`` paces the replay: event time advances ``speedup`` times faster than wall time; ``0`` sends
as fast as the producer goes. Event times are sent as they are in the frame: a replay of history keeps
its timestamps, which the consumer's watermark (not the wall clock) judges for lateness.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from prewarm import validate_model_id

from ._producer import RequestLogProducer

__all__ = ["ReplayResult", "replay_frame"]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    events: int
    seconds: float
    first_ts: float | None
    last_ts: float | None


def _pace_target(ts: float, first_ts: float, wall_start: float, speedup: float) -> float:
    """Wall-clock moment at which the event of time ``ts`` is due."""
    return wall_start + (ts - first_ts) / speedup


def replay_frame(
    frame: pd.DataFrame,
    producer: RequestLogProducer,
    *,
    speedup: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReplayResult:
    """Send every row of ``frame`` (sorted by ``timestamp``) as a v1 request event, keyed by model."""
    started = clock()
    if frame.empty:
        return ReplayResult(0, 0.0, None, None)
    stamps = frame["timestamp"].to_numpy(dtype=np.float64)
    ts_ms = np.floor(stamps * 1000.0).astype(np.int64)
    models = frame["model"].astype(str).to_numpy(dtype=object)
    # Ids are validated once per distinct id; a validated id needs no JSON escaping (see prewarm._ids).
    keys: dict[str, bytes] = {}
    for model in pd.unique(models):
        validate_model_id(model)
        keys[model] = model.encode()
    first = float(stamps[0])
    for i in range(len(stamps)):
        model = models[i]
        if speedup > 0 and i % 64 == 0:
            wait = _pace_target(float(stamps[i]), first, started, speedup) - clock()
            if wait > 0:
                sleep(wait)
        value = b'{"v":1,"ts":%d,"model":"%s"}' % (ts_ms[i], keys[model])
        producer.send_raw(value, keys[model])
    producer.flush()
    return ReplayResult(len(stamps), clock() - started, first, float(stamps[-1]))
