"""Idle-time structure per model: how the chance of a request depends on the time since the last one.

A timer every 37 minutes, a weekday job, a session of bursts: for such models the seasonal week table
says *how often* but not *when*, because when depends on the time since the last request. The model here
is a modulated renewal process on the minutes that have a request ("active minutes"): the chance that
minute ``t`` is active, ``τ`` minutes after the last active one, is

    h(t, τ) = min(p(t) · g(τ), h_max),    p(t) = 1 - exp(-c·λ(t))

with ``λ(t)`` and ``c`` the bundle's seasonal rate and calibration factor, and ``g(τ)`` the idle-time
factor: over the training span, the active minutes observed at idle time ``τ`` divided by the number the
seasonal forecast expected there (the sum of ``p`` over the minutes at that idle time). A Poisson model
(memoryless, however seasonal) has ``g ≈ 1`` everywhere, a timer a spike at its period and a dip before
it, a job the seasonal table already explains ``g ≈ 1`` near a day and a dip in between.

``g`` is estimated per bin of idle time (one bin per minute up to ``FINE`` minutes, where timers' periods
are exact, then 5 % wider bins up to a week) with a gamma prior of mean 1: ``g = (observed + a) /
(expected + a)``. How much structure a model has is decided on a day ``g`` was not estimated on: ``g``
is estimated on the training span but its last ``validation_days``, and for each prior strength ``a`` in
``PRIORS`` the one-minute log loss on that last day is compared with the bundle's own forecast (with its
active/idle calibration). That forecast was fitted on the whole span, the last day included, so the
comparison favours it (a seasonal naive profile holds a third of that day's requests); judging against
the family refitted without the last day was tried and was no better on the simulator's suite
(docs/benchmarks.md, the thirty-first stop). A model keeps ``g`` only if some ``a`` wins by at least
``MIN_GAIN_NATS``; ``g`` is then re-estimated on the whole span with that ``a``. Every other model has
no structure (``prior = inf``): the forecaster says so by forecasting its calibrated seasonal rate —
with the bundle's active/idle factors only where those, too, win on that day by the same margin
(``state``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from forecaster._calendar import DAY_MIN
from forecaster._codec import check_version, decode_array, encode_array
from forecaster._history import History
from forecaster._select import recent_activity
from prewarm import ForecastError

if TYPE_CHECKING:
    from forecaster._bundle import ForecasterBundle

__all__ = ["H_MAX", "IDLE_FILE", "IDLE_VERSION", "TAU_MAX", "IdleProfile", "fit_idle_profile"]

IDLE_VERSION = 1
FINE = 128
"""Idle times up to this many minutes get a bin each: a timer's period is a whole number of minutes."""
_RATIO = 1.05
TAU_MAX = 7 * DAY_MIN
"""Idle times from here on (a week) share the last bin."""
PRIORS = (0.25, 1.0, 4.0)
MIN_GAIN_NATS = 2.0
"""The validation-day log loss a model's idle-time factor must save to be kept (a likelihood-ratio margin)."""
H_MAX = 0.995
_MIN_IDLES = 5
IDLE_FILE = "idle.json"


def idle_edges() -> npt.NDArray[np.int64]:
    """The first idle time (minutes) of each bin; the last bin is open-ended."""
    coarse = np.unique(np.round(FINE * _RATIO ** np.arange(1, 200)).astype(np.int64))
    coarse = coarse[(coarse > FINE) & (coarse <= TAU_MAX)]
    return np.concatenate([np.arange(1, FINE + 1, dtype=np.int64), coarse])


def bin_lookup(edges: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``lookup[τ]``: the bin of idle time ``τ`` minutes, for ``τ`` in ``0 .. TAU_MAX``."""
    bins = np.searchsorted(edges, np.arange(TAU_MAX + 1), side="right") - 1
    return np.asarray(np.clip(bins, 0, edges.size - 1), dtype=np.int64)


@dataclass(frozen=True)
class IdleProfile:
    """Per model: its last request in training and its idle-time factor ``g`` over the bins of ``edges``.

    ``prior[i]`` is the prior strength chosen for model ``i``, ``inf`` where it has no structure (its
    row of ``g`` is then all ones). ``state[i]``: whether a model without structure is better forecast
    with the bundle's active/idle factors than with its unconditional one. ``last_minute[i]`` is the
    epoch minute of its last request in the training span, ``NaN`` if it had none.
    """

    models: list[str]
    last_minute: npt.NDArray[np.float64]
    prior: npt.NDArray[np.float64]
    g: npt.NDArray[np.float64]
    state: npt.NDArray[np.bool_]
    edges: npt.NDArray[np.int64] = field(default_factory=idle_edges)
    lookup: npt.NDArray[np.int64] = field(init=False, repr=False)
    """``lookup[τ]``: the bin of idle time ``τ`` minutes, for ``τ`` in ``0 .. TAU_MAX``."""
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.models)
        if (
            self.last_minute.shape != (n,)
            or self.prior.shape != (n,)
            or self.state.shape != (n,)
            or self.g.shape != (n, self.edges.size)
        ):
            raise ValueError("last_minute, prior, state and g need a row per model, g a column per bin")
        object.__setattr__(self, "lookup", bin_lookup(self.edges))
        object.__setattr__(self, "index", {m: i for i, m in enumerate(self.models)})

    @property
    def structured(self) -> npt.NDArray[np.bool_]:
        return np.asarray(np.isfinite(self.prior), dtype=bool)

    @classmethod
    def empty(cls, models: list[str]) -> IdleProfile:
        """No structure and no known last request: what a bundle trained before idle profiles gets (its
        active/idle factors are used as ``predict(recent=...)`` uses them)."""
        n = len(models)
        edges = idle_edges()
        return cls(
            list(models),
            np.full(n, np.nan),
            np.full(n, np.inf),
            np.ones((n, edges.size)),
            np.ones(n, dtype=bool),
            edges,
        )

    # -- persistence (a file of the bundle directory) ----------------------------------------------

    def save(self, directory: Path) -> None:
        structured = {
            m: {"prior": float(self.prior[i]), "g": encode_array(self.g[i])}
            for i, m in enumerate(self.models)
            if np.isfinite(self.prior[i])
        }
        payload = {
            "version": IDLE_VERSION,
            "edges": self.edges.tolist(),
            "models": self.models,
            "last_minute": [None if np.isnan(v) else float(v) for v in self.last_minute],
            "state": [bool(v) for v in self.state],
            "structured": structured,
        }
        (directory / IDLE_FILE).write_text(json.dumps(payload, allow_nan=False))

    @classmethod
    def load(cls, directory: Path) -> IdleProfile | None:
        """The profile saved in a bundle directory; ``None`` for a bundle saved without one."""
        path = directory / IDLE_FILE
        if not path.exists():
            return None
        try:
            payload = json.loads(path.read_text())
            check_version(payload, IDLE_VERSION, str(path))
            models = [str(m) for m in payload["models"]]
            edges = np.asarray(payload["edges"], dtype=np.int64)
            last = np.array([np.nan if v is None else float(v) for v in payload["last_minute"]])
            prior = np.full(len(models), np.inf)
            g = np.ones((len(models), edges.size))
            index = {m: i for i, m in enumerate(models)}
            for model, entry in payload["structured"].items():
                prior[index[model]] = float(entry["prior"])
                g[index[model]] = decode_array(entry["g"])
            state = np.asarray(payload["state"], dtype=bool)
            return cls(models, last, prior, g, state, edges)
        except ForecastError:
            raise
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ForecastError(f"{path}: malformed idle profile: {exc}") from exc


def fit_idle_profile(
    history: History, bundle: ForecasterBundle, *, validation_days: float = 1.0, chunk: int = 64
) -> IdleProfile:
    """The idle-time profile of every bundle model from ``history`` (its training span), in bundle order.

    Vectorised over models, ``chunk`` models at a time to bound memory on weeks of thousands of models.
    """
    models = bundle.models
    n = len(models)
    edges = idle_edges()
    profile = IdleProfile.empty(models)
    last, prior, g = profile.last_minute.copy(), profile.prior.copy(), profile.g.copy()
    state = profile.state.copy()
    rows = [
        (i, bundle_row)
        for i, m in enumerate(history.models)
        if (bundle_row := profile.index.get(m)) is not None
    ]
    if not rows or history.minutes == 0:
        return profile
    stamps = history.timestamps()
    validation = int(validation_days * DAY_MIN)
    split = history.minutes - validation if history.minutes - validation >= DAY_MIN else history.minutes
    for lo in range(0, len(rows), chunk):
        part = rows[lo : lo + chunk]
        hist_rows = np.array([r[0] for r in part], dtype=np.int64)
        out_rows = np.array([r[1] for r in part], dtype=np.int64)
        fitted = _fit_chunk(history, hist_rows, [models[r] for r in out_rows], bundle, stamps, split, edges)
        last[out_rows], prior[out_rows], g[out_rows], state[out_rows] = fitted
    assert last.shape == (n,)
    return IdleProfile(list(models), last, prior, g, state, edges)


def _fit_chunk(
    history: History,
    hist_rows: npt.NDArray[np.int64],
    models: list[str],
    bundle: ForecasterBundle,
    stamps: npt.NDArray[np.int64],
    split: int,
    edges: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    counts = np.array(history.counts[hist_rows], dtype=np.float64)
    counts[~np.isfinite(counts) | (counts < 0)] = np.nan
    c, t = counts.shape
    observed = ~np.isnan(counts)
    active = np.nan_to_num(counts) > 0
    steps = np.arange(t)
    run = np.maximum.accumulate(np.where(active, steps, -1), axis=1)
    last = np.where(run[:, -1] >= 0, history.start // 60 + run[:, -1], np.nan).astype(np.float64)
    previous = np.concatenate([np.full((c, 1), -1), run[:, :-1]], axis=1)
    valid = (previous >= 0) & observed
    bins = bin_lookup(edges)[np.minimum(steps - previous, TAU_MAX)]
    scale = bundle.scales(models)
    p = -np.expm1(-scale[:, None] * bundle.rates(stamps, models))
    nb = edges.size
    flat = np.arange(c)[:, None] * nb + bins
    early = steps < split

    def sums(mask: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        obs = np.bincount(flat[mask], weights=active[mask].astype(np.float64), minlength=c * nb)
        exp = np.bincount(flat[mask], weights=p[mask], minlength=c * nb)
        return np.asarray(obs, np.float64).reshape(c, nb), np.asarray(exp, np.float64).reshape(c, nb)

    obs_fit, exp_fit = sums(valid & early)
    obs_rest, exp_rest = sums(valid & ~early)
    prior = np.full(c, np.inf)
    g = np.ones((c, nb))
    state = np.ones(c, dtype=bool)
    if split >= t:
        return last, prior, g, state  # too short to tell structure from noise on unseen data
    # The validation day: the bundle's own one-minute forecast, with its unconditional factor or with
    # its active/idle ones (the bundle chose those on folds this day belongs to: they must win clearly)...
    late = slice(split, t)
    y = active[:, late]
    known = observed[:, late]
    csum = np.concatenate([np.zeros((c, 1)), np.cumsum(active, axis=1)], axis=1)
    was_active = recent_activity(csum, steps[late], bundle.state_minutes)
    lam = bundle.rates(stamps[late], models)
    base_scale = np.where(
        was_active, bundle.scales(models, "active")[:, None], bundle.scales(models, "idle")[:, None]
    )
    plain = _log_loss(-np.expm1(-bundle.scales(models)[:, None] * lam), y, known)
    with_state = _log_loss(-np.expm1(-base_scale * lam), y, known)
    state = with_state <= plain - MIN_GAIN_NATS
    best = np.where(state, with_state, plain)
    baseline = best.copy()
    late_bins, late_valid, p_late = bins[:, late], valid[:, late], p[:, late]
    # ... against the idle-time factor estimated without that day, at each prior strength.
    for a in PRIORS:
        g_a = (obs_fit + a) / (exp_fit + a)
        factor = np.take_along_axis(g_a, late_bins, axis=1)
        h = np.where(late_valid, np.minimum(p_late * factor, H_MAX), p_late)
        loss = _log_loss(h, y, known)
        better = (loss < best) & (loss <= baseline - MIN_GAIN_NATS) & (obs_fit.sum(axis=1) >= _MIN_IDLES)
        prior[better] = a
        best = np.where(better, loss, best)
    keep = np.isfinite(prior)
    a_kept = prior[keep][:, None]
    g[keep] = (obs_fit[keep] + obs_rest[keep] + a_kept) / (exp_fit[keep] + exp_rest[keep] + a_kept)
    return last, prior, g, state & ~keep


def _log_loss(
    p: npt.NDArray[np.float64], y: npt.NDArray[np.bool_], known: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """Total log loss per row over the known minutes (nats)."""
    q = np.clip(p, 1e-6, 1.0 - 1e-6)
    loss = -np.where(y, np.log(q), np.log1p(-q))
    return np.asarray(np.where(known, loss, 0.0).sum(axis=1), dtype=np.float64)
