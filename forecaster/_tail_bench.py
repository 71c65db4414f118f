"""``run_tail_bench``: what ``LiveForecasts`` adds on the long tail, scored on days the bundle never saw.

A ``tail_trace`` (timers, weekday jobs, Poisson models, sessions, a flash crowd, deprecations, launches,
busy models) is cut after ``train_days``; ``fit_bundle`` is fitted (and timed) on the requests before the
cut, then at every ``step_minutes`` minute of the rest three forecasters are asked for P(any request in
the next 1, 5 and 10 minutes):

- ``bundle``: the plain ``ForecasterBundle.predict(now)`` (blind to models launched after training);
- ``runtime``: what the live scheduler plans with today: ``predict(now, recent=...)`` with the requests
  of the last ``state_minutes`` for the bundle's models and the last hour's rate
  (``recent_rate_forecasts``) for the others;
- ``live``: ``LiveForecasts``, shown every request before ``now`` through ``observe``.

Scores per pattern kind and window: mean log loss and Brier over every model and origin; reliability
and ECE for the memoryless kinds (``poisson``, ``poisson_diurnal``), where a calibrated forecaster must
not invent structure. Speed: ``fit_bundle`` (and its idle-time part), and ``LiveForecasts`` called every
5 minutes over the scored span with the bundle's full horizon, against ``predict`` called alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from forecaster._backtest import fit_bundle
from forecaster._bundle import ForecasterBundle
from forecaster._history import History
from forecaster._idle import fit_idle_profile
from forecaster._live import LiveForecasts
from forecaster._scoring import reliability, window_sums
from forecaster._tail_trace import TailTrace, tail_trace

__all__ = ["TailBench", "run_tail_bench"]

WINDOWS = (1, 5, 10)
SOURCES = ("bundle", "runtime", "live")
MEMORYLESS = ("poisson", "poisson_diurnal")
_EPS = 1e-6


@dataclass(frozen=True)
class TailBench:
    """What one ``run_tail_bench`` measured; ``to_json`` is its published layout."""

    setup: dict[str, Any]
    scores: dict[str, dict[str, dict[str, dict[str, float]]]]
    """kind -> source -> window ("1m", "5m", "10m") -> {"log_loss", "brier", "forecasts"}."""
    calibration: dict[str, dict[str, Any]]
    """source -> window -> {"ece", "reliability"} over the memoryless kinds."""
    speed: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "setup": self.setup,
            "scores": self.scores,
            "calibration": self.calibration,
            "speed": self.speed,
        }

    def gain(self, kind: str, window: int = 10, metric: str = "log_loss") -> float:
        """How much lower ``live`` scores than the better of ``bundle`` and ``runtime`` (positive: better)."""
        by_source = self.scores[kind]
        key = f"{window}m"
        base = min(by_source["bundle"][key][metric], by_source["runtime"][key][metric])
        return base - by_source["live"][key][metric]


def run_tail_bench(
    *,
    models: int = 60,
    days: float = 7.0,
    train_days: float = 5.0,
    seed: int = 0,
    step_minutes: int = 1,
    progress: Callable[[str], None] = lambda _line: None,
) -> TailBench:
    """Fit on the first ``train_days`` of a ``tail_trace``, score every ``step_minutes`` after them."""
    began = time.perf_counter()
    trace = tail_trace(models, days, seed=seed, event_day=train_days)
    cut = trace.start + train_days * 86400.0
    end = trace.start + days * 86400.0
    frame = trace.frame()
    train = History.from_events(frame[frame["timestamp"] < cut], start=trace.start, end=cut)
    everything = History.from_events(frame, start=trace.start, end=end)
    generate_s = time.perf_counter() - began
    progress(f"generated {models} models x {days:g} days ({trace.timestamps.size} requests); fitting")
    t0 = time.perf_counter()
    bundle = fit_bundle(train)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fit_idle_profile(train, bundle)
    idle_s = time.perf_counter() - t0
    progress(f"fit_bundle {fit_s:.1f}s (idle profile {idle_s:.2f}s); scoring")
    p, outcome = _score_origins(trace, bundle, everything, cut, end, step_minutes)
    kinds = [trace.kinds[m] for m in everything.models]
    scores = _scores(p, outcome, kinds)
    memoryless = np.array([k in MEMORYLESS for k in kinds])
    calibration: dict[str, dict[str, Any]] = {}
    for s, source in enumerate(SOURCES):
        calibration[source] = {}
        for w, window in enumerate(WINDOWS):
            table, ece = reliability(p[s, memoryless, :, w], outcome[memoryless, :, w])
            calibration[source][f"{window}m"] = {"ece": ece, "reliability": table}
    progress("timing LiveForecasts every 5 minutes over the scored span")
    speed = {"generate_seconds": round(generate_s, 2), "fit_bundle_seconds": round(fit_s, 2)}
    speed["idle_profile_seconds"] = round(idle_s, 3)
    speed.update(_timings(trace, bundle, cut, end))
    setup = {
        "models": models,
        "days": days,
        "train_days": train_days,
        "seed": seed,
        "step_minutes": step_minutes,
        "requests": int(trace.timestamps.size),
        "bundle_models": len(bundle.models),
        "structured_models": int(bundle.idle.structured.sum()) if bundle.idle is not None else 0,
    }
    return TailBench(setup, scores, calibration, speed)


def _score_origins(
    trace: TailTrace,
    bundle: ForecasterBundle,
    everything: History,
    cut: float,
    end: float,
    step: int,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """P (``(sources, models, origins, windows)``) and outcomes (``(models, origins, windows)``)."""
    longest = max(WINDOWS)
    first = int((cut - everything.start) // 60)
    last = int((end - everything.start) // 60) - longest
    origins = np.arange(first, last + 1, step)
    counts = np.nan_to_num(everything.counts)
    outcome = np.stack(
        [(window_sums(counts, 0, w)[:, origins] > 0).astype(np.float64) for w in WINDOWS], axis=2
    )
    row = {m: i for i, m in enumerate(everything.models)}
    known = set(bundle.models)
    in_bundle = np.array([m in known for m in everything.models])
    bundle_rows = np.array([row[m] for m in bundle.models], dtype=np.int64)
    p = np.zeros((len(SOURCES), len(everything.models), origins.size, len(WINDOWS)))
    live = LiveForecasts(bundle, horizon_s=60 * longest)
    cols = np.asarray(WINDOWS)
    ts, names = trace.timestamps, trace.models
    j = int(np.searchsorted(ts, cut))
    for o, origin in enumerate(origins):
        now = float(everything.start + 60 * origin)
        k = int(np.searchsorted(ts, now))
        for at, model in zip(ts[j:k].tolist(), names[j:k].tolist(), strict=True):
            live.observe(model, at)
        j = k
        plain = bundle.predict(now, 60 * longest)
        recent = {
            m: float(counts[row[m], origin - bundle.state_minutes : origin].sum()) for m in bundle.models
        }
        with_recent = bundle.predict(now, 60 * longest, recent=recent)
        p[0, bundle_rows, o] = np.stack([-np.expm1(plain[m].log_miss[cols]) for m in bundle.models])
        p[1, bundle_rows, o] = np.stack([-np.expm1(with_recent[m].log_miss[cols]) for m in bundle.models])
        # The runtime's forecast for the rest: the last hour's rate, as recent_rate_forecasts computes it.
        hour = counts[~in_bundle, max(0, origin - 60) : origin]
        rate = 0.5 * hour.mean(axis=1) + 0.5 * hour[:, -10:].mean(axis=1) if hour.size else np.zeros(0)
        p[1, ~in_bundle, o] = -np.expm1(-rate[:, None] * cols[None, :])
        forecasts = live(now)
        for m, fc in forecasts.items():
            if m in row:
                p[2, row[m], o] = -np.expm1(fc.log_miss[cols])
    return p, outcome


def _scores(
    p: npt.NDArray[np.float64], outcome: npt.NDArray[np.float64], kinds: list[str]
) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    labels = np.asarray(kinds)
    for kind in [*sorted(set(kinds)), "all"]:
        rows = np.ones(labels.size, dtype=bool) if kind == "all" else labels == kind
        out[kind] = {}
        for s, source in enumerate(SOURCES):
            out[kind][source] = {}
            for w, window in enumerate(WINDOWS):
                q = np.clip(p[s, rows, :, w], _EPS, 1.0 - _EPS)
                y = outcome[rows, :, w]
                loss = -(y * np.log(q) + (1.0 - y) * np.log1p(-q))
                out[kind][source][f"{window}m"] = {
                    "log_loss": round(float(loss.mean()), 5),
                    "brier": round(float(((p[s, rows, :, w] - y) ** 2).mean()), 5),
                    "forecasts": int(y.size),
                }
    return out


def _timings(trace: TailTrace, bundle: ForecasterBundle, cut: float, end: float) -> dict[str, float]:
    """``LiveForecasts`` and ``predict`` every 5 minutes from ``cut`` to ``end``, full horizon."""
    live = LiveForecasts(bundle)
    ts, names = trace.timestamps, trace.models
    j = int(np.searchsorted(ts, cut))
    observe_s, call_s, predict_s = 0.0, [], []
    for now in np.arange(cut, end, 300.0):
        k = int(np.searchsorted(ts, now))
        batch = list(zip(names[j:k].tolist(), ts[j:k].tolist(), strict=True))
        j = k
        t0 = time.perf_counter()
        for model, at in batch:
            live.observe(model, at)
        observe_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        live(float(now))
        call_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bundle.predict(float(now))
        predict_s.append(time.perf_counter() - t0)
    observed = int(np.searchsorted(ts, end) - np.searchsorted(ts, cut))
    return {
        "live_calls": len(call_s),
        "live_seconds_total": round(sum(call_s), 3),
        "live_seconds_median": round(statistics.median(call_s), 5),
        "live_seconds_max": round(max(call_s), 5),
        "predict_seconds_total": round(sum(predict_s), 3),
        "observe_seconds_total": round(observe_s, 3),
        "observe_microseconds_each": round(1e6 * observe_s / max(observed, 1), 3),
    }


def summary_frame(bench: TailBench, window: int = 10) -> pd.DataFrame:
    """Log loss and Brier per kind and source at ``window`` minutes, one row per kind (for people)."""
    rows = []
    for kind, by_source in bench.scores.items():
        row: dict[str, Any] = {"kind": kind}
        for source, by_window in by_source.items():
            row[f"{source}_log_loss"] = by_window[f"{window}m"]["log_loss"]
            row[f"{source}_brier"] = by_window[f"{window}m"]["brier"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("kind")
